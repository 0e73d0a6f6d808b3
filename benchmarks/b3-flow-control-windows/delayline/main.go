// delayline: a user-space network delay line for benchmark B3 (benchmarks/b3-flow-control-windows).
//
// It stands in for `tc qdisc ... netem delay`, which the benchmark machine's kernel lacks
// (no sch_netem, no modules to load). It opens one TUN device in each of two network
// namespaces, reads every IP packet that enters one device, holds it for half the requested
// round-trip time and writes it, unchanged and in order, out of the other; both directions.
// TCP therefore stays end to end between the namespaces: nothing terminates or re-segments
// connections, only the path gets longer, which is what netem would have done.
//
// The TUN devices are not persistent: they disappear when this process exits, whatever way it
// exits, so a benchmark that kills it leaves no device behind. Addresses, MTU and link state
// are set by the caller with `ip -n NS ...` once the ready file exists.
//
//	delayline -a NS:DEV -b NS:DEV -rtt 20ms [-queue 65536] [-offload=true] [-ready FILE]
//
// Standard library only, so it builds offline. Linux only.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

const (
	iffTun        = 0x0001
	iffNoPi       = 0x1000
	iffVnetHdr    = 0x4000
	tunSetIff     = 0x400454ca // _IOW('T', 202, int)
	tunSetOffload = 0x400454d0 // _IOW('T', 208, unsigned int)
	tunFCsum      = 0x01
	tunFTso4      = 0x02
	tunFTso6      = 0x04
	vnetHdrLen    = 10           // struct virtio_net_hdr, TUN's default header size
	maxPacket     = 65536 + 1024 // a TUN GSO packet (at most 64 KiB) and its header
)

type ifreq struct {
	name  [16]byte
	flags uint16
	_     [22]byte
}

// openTun creates TUN device dev inside network namespace ns and returns its file. The device
// belongs to the namespace the opening thread is in, so a locked OS thread enters the namespace,
// opens the device and then dies with its goroutine (the Go runtime retires a thread that exits
// locked), never running other goroutines inside the foreign namespace.
//
// With offload, the device carries TCP segmentation-offload packets (up to 64 KiB, each
// preceded by a virtio_net_hdr saying how to cut it into MTU-sized segments) instead of
// segmenting in software first, exactly as a veth pair passes GSO packets to netem; the other
// device, fed the same header, delivers them as one GRO-sized packet. TCP still sees the MTU
// (its MSS and congestion window are in MTU-sized segments); the delay line just moves 40 times
// fewer, larger units, which is what lets it keep up with a modern TCP stream.
func openTun(ns, dev string, offload bool) (*os.File, error) {
	type result struct {
		f   *os.File
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		f, err := func() (*os.File, error) {
			nsf, err := os.Open("/var/run/netns/" + ns)
			if err != nil {
				return nil, err
			}
			defer nsf.Close()
			if _, _, e := syscall.RawSyscall(sysSetns, nsf.Fd(), syscall.CLONE_NEWNET, 0); e != 0 {
				return nil, fmt.Errorf("setns %s: %v", ns, e)
			}
			fd, err := syscall.Open("/dev/net/tun", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
			if err != nil {
				return nil, fmt.Errorf("open /dev/net/tun: %v", err)
			}
			var req ifreq
			copy(req.name[:15], dev)
			req.flags = iffTun | iffNoPi
			if offload {
				req.flags |= iffVnetHdr
			}
			if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), tunSetIff, uintptr(unsafe.Pointer(&req))); e != 0 {
				syscall.Close(fd)
				return nil, fmt.Errorf("TUNSETIFF %s in %s: %v", dev, ns, e)
			}
			if offload {
				if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), tunSetOffload, tunFCsum|tunFTso4|tunFTso6); e != 0 {
					syscall.Close(fd)
					return nil, fmt.Errorf("TUNSETOFFLOAD %s in %s: %v", dev, ns, e)
				}
			}
			// Non-blocking, so the Go runtime's poller serves reads and goroutines do not
			// each hold an OS thread.
			if err := syscall.SetNonblock(fd, true); err != nil {
				syscall.Close(fd)
				return nil, err
			}
			return os.NewFile(uintptr(fd), ns+":"+dev), nil
		}()
		ch <- result{f, err}
		// Returning while locked ends this thread, namespace and all.
	}()
	r := <-ch
	return r.f, r.err
}

type packet struct {
	buf *[]byte
	n   int
	due time.Time
}

type stats struct {
	packets, bytes, dropped, maxQueue atomic.Int64
}

var bufs = sync.Pool{New: func() any { b := make([]byte, maxPacket); return &b }}

// pump moves packets from one device to the other, each leaving `delay` after it arrived. One
// goroutine reads and stamps, one writes; the queue between them is FIFO and the delay is the
// same for every packet, so order is kept. A full queue drops the packet, as a router would.
func pump(from, to *os.File, delay time.Duration, queue int, st *stats) {
	q := make(chan packet, queue)
	go func() {
		for p := range q {
			if d := time.Until(p.due); d > 0 {
				sleep(d)
			}
			if _, err := to.Write((*p.buf)[:p.n]); err != nil {
				st.dropped.Add(1) // e.g. the destination device is not up yet
			} else {
				st.packets.Add(1)
				st.bytes.Add(int64(p.n))
			}
			bufs.Put(p.buf)
		}
	}()
	for {
		b := bufs.Get().(*[]byte)
		n, err := from.Read(*b)
		if err != nil {
			fmt.Fprintf(os.Stderr, "delayline: read %s: %v\n", from.Name(), err)
			os.Exit(1)
		}
		select {
		case q <- packet{b, n, time.Now().Add(delay)}:
			if l := int64(len(q)); l > st.maxQueue.Load() {
				st.maxQueue.Store(l)
			}
		default:
			st.dropped.Add(1)
			bufs.Put(b)
		}
	}
}

// sleep blocks this goroutine's OS thread in nanosleep(2): the kernel's high-resolution timer
// wakes it within tens of microseconds, where the Go runtime's timers can be a millisecond late.
func sleep(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	for syscall.Nanosleep(&ts, &ts) == syscall.EINTR {
	}
}

func splitEnd(s string) (string, string) {
	ns, dev, ok := strings.Cut(s, ":")
	if !ok || ns == "" || dev == "" || len(dev) > 15 {
		fmt.Fprintf(os.Stderr, "delayline: %q is not NETNS:DEVICE (device name at most 15 characters)\n", s)
		os.Exit(2)
	}
	return ns, dev
}

func main() {
	a := flag.String("a", "", "first end, NETNS:DEVICE")
	b := flag.String("b", "", "second end, NETNS:DEVICE")
	rtt := flag.Duration("rtt", 0, "round-trip time to add (each direction gets half)")
	queue := flag.Int("queue", 65536, "packets held per direction before dropping")
	offload := flag.Bool("offload", true, "carry TSO/GSO packets (virtio_net_hdr) instead of MTU-sized ones")
	ready := flag.String("ready", "", "file to create once both devices exist")
	flag.Parse()
	if *a == "" || *b == "" || *rtt < 0 || *queue < 1 {
		flag.Usage()
		os.Exit(2)
	}
	nsA, devA := splitEnd(*a)
	nsB, devB := splitEnd(*b)
	fa, err := openTun(nsA, devA, *offload)
	if err != nil {
		fmt.Fprintln(os.Stderr, "delayline:", err)
		os.Exit(1)
	}
	fb, err := openTun(nsB, devB, *offload)
	if err != nil {
		fmt.Fprintln(os.Stderr, "delayline:", err)
		os.Exit(1)
	}
	var ab, ba stats
	go pump(fa, fb, *rtt/2, *queue, &ab)
	go pump(fb, fa, *rtt/2, *queue, &ba)
	if *ready != "" {
		if err := os.WriteFile(*ready, []byte("ready\n"), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "delayline:", err)
			os.Exit(1)
		}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	for _, d := range []struct {
		name string
		st   *stats
	}{{*a + " -> " + *b, &ab}, {*b + " -> " + *a, &ba}} {
		fmt.Fprintf(os.Stderr, "delayline: %s: %d packets, %d bytes, %d dropped, max queue %d\n",
			d.name, d.st.packets.Load(), d.st.bytes.Load(), d.st.dropped.Load(), d.st.maxQueue.Load())
	}
}
