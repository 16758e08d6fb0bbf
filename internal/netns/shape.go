package netns

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/ti-mo/netfilter"
	"golang.org/x/sys/unix"

	"sbx.dev/sbx/api"
)

// Shape is a perturbation of the traffic that leaves a sandbox: each packet
// it sends out is held Delay, and dropped with probability Loss, in its
// gateway namespace. explain measures a test's rate under it per fork. The
// zero Shape is none.
//
// The kernel of this kind of machine has no sch_netem, so Delay is made in
// sbxd: a netfilter queue in the gateway namespace hands each packet to
// sbxd, which lets it go once it is Delay old. The rule bypasses the queue
// when nothing listens on it, so a sandbox whose sbxd is gone (a restart,
// until it shapes the sandbox again) loses its delay, not its network. Loss
// is iptables' statistic match, in the kernel.
type Shape struct {
	Delay time.Duration
	Loss  float64 // a fraction, [0, 1)
}

// Zero reports whether s is no perturbation at all.
func (s Shape) Zero() bool { return s.Delay == 0 && s.Loss == 0 }

// Check errors, wrapping ErrInvalid, on a Delay out of [0, api.MaxNetDelay]
// (the API's bound, written once there) or a
// Loss out of [0, 1).
func (s Shape) Check() error {
	if s.Delay < 0 || s.Delay > api.MaxNetDelay {
		return fmt.Errorf("delay %s: %w: want 0 to %s", s.Delay, ErrInvalid, api.MaxNetDelay)
	}
	if math.IsNaN(s.Loss) || s.Loss < 0 || s.Loss >= 1 {
		return fmt.Errorf("loss %v: %w: want a fraction from 0 up to (not including) 1", s.Loss, ErrInvalid)
	}
	return nil
}

const (
	shapeChain = "SBX-SHAPE"
	// shapeQueue is the netfilter queue of a gateway namespace: one per
	// namespace, so every sandbox's is 0.
	shapeQueue = 0
	// shapeQueueLen bounds what one sandbox has held in the kernel; past
	// it, packets go at once (the queue fails open).
	shapeQueueLen = 4096
	// shapeRate bounds the packets a second one sandbox hands sbxd to
	// delay; a flood past it goes undelayed.
	shapeRate = "10000/second" // the most xt_limit takes
)

// Shape applies s to the traffic leaving sandbox id (the zero Shape
// removes any), replacing what was there. It is idempotent, and a sbxd
// that restarts calls it again for each shaped sandbox: the rules outlive
// it in the gateway namespace, the queue reader does not. It errors
// wrapping ErrInvalid on a bad s, os.ErrNotExist on a missing namespace.
func (m *Manager) Shape(id string, s Shape) error {
	if err := checkID(id); err != nil {
		return fmt.Errorf("shape network %s: %w", id, err)
	}
	if err := s.Check(); err != nil {
		return fmt.Errorf("shape network %s: %w", id, err)
	}
	_, gPath := m.paths(id)
	if !isNamespace(gPath) {
		return fmt.Errorf("shape network %s: %w", id, os.ErrNotExist)
	}
	// shapeMu guards the map only: the queue and the rules are made with it
	// released (a sandbox is shaped by the one operation that claims it).
	m.shapeMu.Lock()
	d := m.delayers[id]
	m.shapeMu.Unlock()
	if s.Delay > 0 && d == nil {
		nd, err := newDelayer(gPath)
		if err != nil {
			return fmt.Errorf("shape network %s: %w", id, err)
		}
		m.shapeMu.Lock()
		if d = m.delayers[id]; d == nil {
			if m.delayers == nil {
				m.delayers = map[string]*delayer{}
			}
			m.delayers[id], d = nd, nd
		}
		m.shapeMu.Unlock()
		if d != nd {
			nd.close() // another shaping got there first
		}
	}
	if d != nil {
		d.setDelay(s.Delay)
	}
	if err := shapeRules(gPath, s); err != nil {
		return fmt.Errorf("shape network %s: %w", id, err)
	}
	if s.Delay == 0 && d != nil {
		m.unshape(id)
	}
	return nil
}

// Release stops sandbox id's queue reader, if it has one, and keeps its
// rules: for a sandbox that stops (it sends nothing; its next boot shapes
// it again), so that a stopped sandbox holds nothing of sbxd's.
func (m *Manager) Release(id string) { m.unshape(id) }

// unshape stops sandbox id's queue reader, if it has one; its rules go
// with its namespace.
func (m *Manager) unshape(id string) {
	m.shapeMu.Lock()
	d := m.delayers[id]
	delete(m.delayers, id)
	m.shapeMu.Unlock()
	if d != nil {
		d.close()
	}
}

// shapeRules makes the chain SBX-SHAPE of the gateway namespace at gPath
// hold s: what comes in from the sandbox (gw0) to be forwarded is dropped
// with probability s.Loss, then queued to sbxd for s.Delay (at most
// shapeRate packets a second; past it, undelayed).
func shapeRules(gPath string, s Shape) error {
	return inNS(gPath, func() error {
		t, err := ipt()
		if err != nil {
			return err
		}
		if ok, err := t.ChainExists("filter", shapeChain); err != nil {
			return err
		} else if !ok {
			if err := t.NewChain("filter", shapeChain); err != nil {
				return err
			}
		}
		if err := t.InsertUnique("filter", "FORWARD", 1, "-i", gatewayIf, "-j", shapeChain); err != nil {
			return err
		}
		// the new rules go in before the old ones leave: no packet passes
		// unshaped while the shape changes
		lines, err := t.List("filter", shapeChain)
		if err != nil {
			return err
		}
		old := 0
		for _, l := range lines {
			if strings.HasPrefix(l, "-A ") {
				old++
			}
		}
		var fresh [][]string
		if s.Loss > 0 {
			fresh = append(fresh, []string{"-m", "statistic", "--mode", "random", "--probability", strconv.FormatFloat(s.Loss, 'f', -1, 64), "-j", "DROP"})
		}
		if s.Delay > 0 {
			// a flood cannot make sbxd spin: past the rate, undelayed
			fresh = append(fresh, []string{"-m", "limit", "--limit", shapeRate, "--limit-burst", strconv.Itoa(shapeQueueLen),
				"-j", "NFQUEUE", "--queue-num", strconv.Itoa(shapeQueue), "--queue-bypass"})
		}
		for i, spec := range fresh {
			if err := t.Insert("filter", shapeChain, i+1, spec...); err != nil {
				return err
			}
		}
		for ; old > 0; old-- {
			if err := t.DeleteById("filter", shapeChain, len(fresh)+1); err != nil {
				return err
			}
		}
		return nil
	})
}

// Netfilter queue messages and attributes (linux/netfilter/nfnetlink_queue.h).
const (
	nfqnlMsgPacket       = 0
	nfqnlMsgConfig       = 2
	nfqnlMsgVerdictBatch = 3

	nfqaPacketHdr  = 1
	nfqaVerdictHdr = 2

	nfqaCfgCmd      = 1
	nfqaCfgParams   = 2
	nfqaCfgQueueLen = 3
	nfqaCfgMask     = 4
	nfqaCfgFlags    = 5

	nfqnlCfgCmdBind  = 1
	nfqnlCopyMeta    = 1
	nfqaCfgFFailOpen = 1

	nfAccept = 1
)

// delayer holds the packets of one gateway namespace's queue for a delay,
// oldest first, and lets them go in batches: the kernel numbers a queue's
// packets in order, and a batch verdict lets go of every packet up to an
// id, also one whose message a full socket buffer lost.
type delayer struct {
	conn  *netlink.Conn
	mu    sync.Mutex
	delay time.Duration
	last  uint32 // the newest packet's id, once seen
	seen  bool
	// received counts the packets the queue handed over (a test's window
	// on the rate limit)
	received atomic.Int64
	held     chan heldPacket
	done     chan struct{}
	wg       sync.WaitGroup
}

type heldPacket struct {
	id  uint32
	due time.Time
}

// newDelayer binds queue 0 of the namespace at gPath, copying no payload,
// failing open when full.
func newDelayer(gPath string) (*delayer, error) {
	f, err := os.Open(gPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(f.Fd())})
	if err != nil {
		return nil, fmt.Errorf("netfilter queue: %w", err)
	}
	d := &delayer{conn: conn, held: make(chan heldPacket, shapeQueueLen), done: make(chan struct{})}
	cmd := []byte{nfqnlCfgCmdBind, 0, 0, 0} // command, pad, pf (none: the queue's own)
	params := binary.BigEndian.AppendUint32(nil, 0)
	params = append(params, nfqnlCopyMeta)
	for _, attrs := range [][]netfilter.Attribute{
		{{Type: nfqaCfgCmd, Data: cmd}},
		{{Type: nfqaCfgParams, Data: params},
			{Type: nfqaCfgQueueLen, Data: binary.BigEndian.AppendUint32(nil, shapeQueueLen)},
			{Type: nfqaCfgFlags, Data: binary.BigEndian.AppendUint32(nil, nfqaCfgFFailOpen)},
			{Type: nfqaCfgMask, Data: binary.BigEndian.AppendUint32(nil, nfqaCfgFFailOpen)}},
	} {
		msg, err := netfilter.MarshalNetlink(netfilter.Header{
			SubsystemID: netfilter.NFSubsysQueue, MessageType: nfqnlMsgConfig,
			Flags: netlink.Request | netlink.Acknowledge, ResourceID: shapeQueue,
		}, attrs)
		if err == nil {
			_, err = conn.Execute(msg)
		}
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("netfilter queue %d: configure: %w", shapeQueue, err)
		}
	}
	// the socket buffer lost messages are let go by the next batch verdict
	conn.SetOption(netlink.NoENOBUFS, true)
	d.wg.Add(2)
	go d.read()
	go d.release()
	return d, nil
}

func (d *delayer) setDelay(delay time.Duration) {
	d.mu.Lock()
	d.delay = delay
	d.mu.Unlock()
}

// close lets every packet still held go, undelayed, and unbinds the
// queue (the rule then bypasses it).
func (d *delayer) close() {
	close(d.done)
	if id, ok := d.lastSeen(); ok {
		d.verdict(id)
	}
	d.conn.Close()
	d.wg.Wait()
}

func (d *delayer) lastSeen() (uint32, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.last, d.seen
}

// read takes each packet the queue hands over and holds it until it is
// due; when the hold is full, a packet goes at once.
func (d *delayer) read() {
	defer d.wg.Done()
	defer close(d.held)
	for {
		msgs, err := d.conn.Receive()
		if err != nil {
			select {
			case <-d.done:
				return
			default:
			}
			if errors.Is(err, unix.ENOBUFS) {
				continue
			}
			// a socket gone bad: let everything go and stop holding
			return
		}
		now := time.Now()
		d.mu.Lock()
		delay := d.delay
		d.mu.Unlock()
		for _, msg := range msgs {
			id, ok := packetID(msg)
			if !ok {
				continue
			}
			d.received.Add(1)
			d.mu.Lock()
			d.last, d.seen = id, true
			d.mu.Unlock()
			select {
			case d.held <- heldPacket{id: id, due: now.Add(delay)}:
			default:
				d.verdict(id)
			}
		}
	}
}

// release lets the held packets go as they come due, every one due at
// once in a single verdict.
func (d *delayer) release() {
	defer d.wg.Done()
	for p := range d.held {
		if !d.sleepUntil(p.due) {
			return
		}
		last := p.id
		for drained := false; !drained; {
			select {
			case q, ok := <-d.held:
				if !ok {
					d.verdict(last)
					return
				}
				if time.Until(q.due) > 0 {
					d.verdict(last)
					if !d.sleepUntil(q.due) {
						return
					}
				}
				last = q.id
			default:
				drained = true
			}
		}
		d.verdict(last)
	}
}

// sleepUntil waits until t, or reports false once the delayer is closed.
func (d *delayer) sleepUntil(t time.Time) bool {
	wait := time.Until(t)
	if wait <= 0 {
		return true
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-d.done:
		return false
	}
}

// verdict accepts every packet of the queue up to id.
func (d *delayer) verdict(id uint32) {
	hdr := binary.BigEndian.AppendUint32(nil, nfAccept)
	hdr = binary.BigEndian.AppendUint32(hdr, id)
	msg, err := netfilter.MarshalNetlink(netfilter.Header{
		SubsystemID: netfilter.NFSubsysQueue, MessageType: nfqnlMsgVerdictBatch,
		Flags: netlink.Request, ResourceID: shapeQueue,
	}, []netfilter.Attribute{{Type: nfqaVerdictHdr, Data: hdr}})
	if err != nil {
		return
	}
	d.conn.Send(msg)
}

// packetID is the id of a queued packet's message.
func packetID(msg netlink.Message) (uint32, bool) {
	h, attrs, err := netfilter.UnmarshalNetlink(msg)
	if err != nil || h.SubsystemID != netfilter.NFSubsysQueue || h.MessageType != nfqnlMsgPacket {
		return 0, false
	}
	for _, a := range attrs {
		if a.Type == nfqaPacketHdr && len(a.Data) >= 4 {
			return binary.BigEndian.Uint32(a.Data[:4]), true
		}
	}
	return 0, false
}
