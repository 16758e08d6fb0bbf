package controller

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"testing"
	"unicode/utf8"

	"sbx.dev/sbx/api"
)

// TestAttack30ProgressWhyFromNodes: progressOf's why comes from
// placement.Why over SandboxNode status fields a node agent writes (its
// CPU features, its reasons), so it is a hostile node's text. progressOf
// blanks only C0 controls and DEL: a bidi override (U+202E) and a C1 CSI
// (U+0080-U+009F) reach the client's Sbx-Waiting, and sbx prints them.
// And it cuts a long why at byte 2000, in the middle of a rune: the
// header is not UTF-8.
func TestAttack30ProgressWhyFromNodes(t *testing.T) {
	const long = "waiting up to 1m0s for a node where its memory restores: "
	whys := []string{
		"waiting up to 2m0s for a node where its memory restores: n2: lacks CPU features \u202eexe.txt\u009b[2J",
		long + strings.Repeat("x", 1999-len(long)) + "é and more", // é is bytes 1999 and 2000
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := progressOf(w, r)
		for _, why := range whys {
			p(why)
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	var got []string
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			got = append(got, h.Get(api.HeaderWaiting))
			return nil
		},
	})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
	req.Header.Set(api.HeaderProgress, "102")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(got) != 2 {
		t.Fatalf("heard %d 102s, want 2: %q", len(got), got)
	}
	for _, bad := range []string{"\u202e", "\u009b"} {
		if strings.Contains(got[0], bad) {
			t.Errorf("Sbx-Waiting carries %q from a node's status raw: %q", bad, got[0])
		}
	}
	if !utf8.ValidString(got[1]) {
		t.Errorf("Sbx-Waiting of a long why is cut mid-rune, not UTF-8: ...%q", got[1][1990:])
	}
}
