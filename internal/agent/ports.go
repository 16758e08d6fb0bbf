package agent

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"io"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Port is one listening socket in the sandbox.
type Port struct {
	Proto   string `json:"proto"` // "tcp" or "tcp6"
	Address string `json:"address"`
	Port    int    `json:"port"`
	// Pid is the process holding the socket, 0 when it is not known.
	Pid     int    `json:"pid"`
	Command string `json:"command"`
}

// tcpListen is the socket state "LISTEN" in /proc/net/tcp.
const tcpListen = "0A"

// runPorts writes the listening TCP sockets as a JSON array of Port.
func runPorts(args []string, stdout io.Writer) error {
	if _, err := parseFlags(flag.NewFlagSet("ports", flag.ContinueOnError), args, 0, "ports"); err != nil {
		return err
	}
	ports, err := listeningPorts("/proc")
	if err != nil {
		return err
	}
	return writeJSON(stdout, ports)
}

// listeningPorts reads the listening TCP sockets from procfs and finds their
// owners by socket inode; best effort for the owners.
func listeningPorts(proc string) ([]Port, error) {
	type sock struct {
		port  Port
		inode string
	}
	var socks []sock
	for _, proto := range []string{"tcp", "tcp6"} {
		f, err := os.Open(proc + "/net/" + proto)
		if os.IsNotExist(err) {
			continue // no IPv6 in this sandbox
		}
		if err != nil {
			return nil, pathError(proc+"/net/"+proto, err)
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // the header
		for sc.Scan() {
			// sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
			fl := strings.Fields(sc.Text())
			if len(fl) < 10 || fl[3] != tcpListen {
				continue
			}
			addr, port, ok := parseSockAddr(fl[1])
			if !ok {
				continue
			}
			socks = append(socks, sock{Port{Proto: proto, Address: addr, Port: port}, fl[9]})
		}
		f.Close()
	}
	owners := socketOwners(proc)
	ports := make([]Port, 0, len(socks))
	for _, s := range socks {
		if pid, ok := owners[s.inode]; ok && s.inode != "0" {
			s.port.Pid = pid
			if b, err := os.ReadFile(proc + "/" + strconv.Itoa(pid) + "/comm"); err == nil {
				s.port.Command = strings.TrimSpace(string(b))
			}
		}
		ports = append(ports, s.port)
	}
	slices.SortFunc(ports, func(a, b Port) int {
		return cmp.Or(cmp.Compare(a.Port, b.Port), cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.Address, b.Address))
	})
	return ports, nil
}

// parseSockAddr decodes "0100007F:1F90": the address as the kernel prints
// it, 32-bit words in host byte order, and the port in hex.
func parseSockAddr(s string) (string, int, bool) {
	host, portHex, ok := strings.Cut(s, ":")
	if !ok {
		return "", 0, false
	}
	port, err := strconv.ParseUint(portHex, 16, 16)
	if err != nil {
		return "", 0, false
	}
	raw, err := hex.DecodeString(host)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return "", 0, false
	}
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(raw[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	addr, _ := netip.AddrFromSlice(raw)
	return addr.String(), int(port), true
}

// socketOwners maps socket inode numbers to the pid of a process holding
// them, from the /proc/PID/fd links ("socket:[12345]").
func socketOwners(proc string) map[string]int {
	owners := map[string]int{}
	ents, err := os.ReadDir(proc)
	if err != nil {
		return owners
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		dir := proc + "/" + e.Name() + "/fd"
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue // gone, or not ours to read
		}
		for _, fd := range fds {
			link, err := os.Readlink(dir + "/" + fd.Name())
			if err != nil {
				continue
			}
			inode, ok := strings.CutPrefix(link, "socket:[")
			if !ok {
				continue
			}
			inode = strings.TrimSuffix(inode, "]")
			if _, seen := owners[inode]; !seen {
				owners[inode] = pid
			}
		}
	}
	return owners
}
