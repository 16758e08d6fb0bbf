package runsc

import (
	"fmt"
	"io"
	"os"
)

// cappedFile keeps what a sandbox writes to one stream on the host, within
// a budget: the first head bytes go to the file as they come (so they can
// be followed live), then only the last tail bytes are kept, in memory,
// and written at Close after a line that says how much was dropped. A
// write that fails (a full disk) drops its bytes and is counted too:
// nothing a sandbox writes can grow a file, or the shim's memory, past
// head+tail.
type cappedFile struct {
	f        *os.File
	name     string
	head     int64 // bytes still allowed straight to the file
	headSize int64
	tail     []byte // a ring of the last bytes past the head
	tailSize int
	pos      int   // next write position in tail
	full     bool  // the ring has wrapped
	past     int64 // bytes past the head, all told
	failed   int64 // bytes lost to failed writes
	werr     error
}

// newCappedFile appends to f. used is what the file already holds of the
// budget (a re-attached exec's earlier output).
func newCappedFile(f *os.File, name string, head, tail, used int64) *cappedFile {
	return &cappedFile{f: f, name: name, head: max(head-used, 0), headSize: head, tailSize: int(tail)}
}

// Write never fails: what cannot be kept is counted.
func (c *cappedFile) Write(p []byte) (int, error) {
	n := len(p)
	if c.head > 0 {
		k := min(int64(len(p)), c.head)
		if _, err := c.f.Write(p[:k]); err != nil {
			c.failed += k
			if c.werr == nil {
				c.werr = err
			}
		}
		c.head -= k
		p = p[k:]
	}
	if len(p) == 0 {
		return n, nil
	}
	c.past += int64(len(p))
	if c.tailSize == 0 {
		return n, nil
	}
	if c.tail == nil {
		c.tail = make([]byte, c.tailSize)
	}
	if len(p) >= c.tailSize {
		copy(c.tail, p[len(p)-c.tailSize:])
		c.pos, c.full = 0, true
		return n, nil
	}
	k := copy(c.tail[c.pos:], p)
	if k < len(p) {
		copy(c.tail, p[k:])
	}
	if c.pos+len(p) >= c.tailSize {
		c.full = true // filled to its end, or round it: all of it is kept
	}
	c.pos = (c.pos + len(p)) % c.tailSize
	return n, nil
}

// dropped is how many bytes are not in the file once it is closed.
func (c *cappedFile) dropped() int64 {
	kept := int64(c.pos)
	if c.full {
		kept = int64(c.tailSize)
	}
	return c.past - kept + c.failed
}

// Close writes the kept tail after a line that says what was dropped.
func (c *cappedFile) Close() error {
	if c.past > 0 {
		var tail []byte
		if c.full {
			tail = append(append(tail, c.tail[c.pos:]...), c.tail[:c.pos]...)
		} else {
			tail = c.tail[:c.pos]
		}
		// a stream that fits its head and tail is kept whole: no note
		// in the middle of it (34,000,000 bytes came back as 34,000,096)
		if d := c.dropped(); d > 0 {
			note := fmt.Sprintf("\n[sbx: %d bytes of %s dropped: past its first %d bytes only the last %d are kept]\n",
				d, c.name, c.headSize, c.tailSize)
			if _, err := io.WriteString(c.f, note); err != nil && c.werr == nil {
				c.werr = err
			}
		}
		if _, err := c.f.Write(tail); err != nil && c.werr == nil {
			c.werr = err
		}
	} else if c.failed > 0 {
		note := fmt.Sprintf("\n[sbx: %d bytes of %s dropped: %v]\n", c.failed, c.name, c.werr)
		_, _ = io.WriteString(c.f, note)
	}
	return c.f.Close()
}
