package controller

import (
	"context"
	"net"
	"sync"
	"time"
)

// dialAhead opens the TCP connection for a claim's assign call while the
// claim patch is still in flight, so the handshake is off the cold start's
// critical path: when the patch returns, the assign request goes out on a
// connection that is already there. It is the assign client's dialer: a dial
// for an address with a connection started ahead takes that connection, any
// other dials as usual.
type dialAhead struct {
	dialer net.Dialer
	mu     sync.Mutex
	ahead  map[string]*aheadConn // by address; one per address, the newest
}

// aheadConn is a connection being opened ahead, or opened.
type aheadConn struct {
	done chan struct{} // closed when the dial ended
	conn net.Conn
	err  error
}

func newDialAhead(timeout time.Duration) *dialAhead {
	return &dialAhead{dialer: net.Dialer{Timeout: timeout}, ahead: map[string]*aheadConn{}}
}

// start begins dialling addr. The returned release closes the connection
// unless a dial took it, and must be called once the claim no longer needs
// it (assigned, or failed).
func (d *dialAhead) start(ctx context.Context, addr string) (release func()) {
	a := &aheadConn{done: make(chan struct{})}
	d.mu.Lock()
	d.ahead[addr] = a
	d.mu.Unlock()
	go func() { // ends with the dial, bounded by the dialer's timeout and ctx
		a.conn, a.err = d.dialer.DialContext(ctx, "tcp", addr)
		close(a.done)
	}()
	return func() {
		d.mu.Lock()
		mine := d.ahead[addr] == a
		if mine {
			delete(d.ahead, addr)
		}
		d.mu.Unlock()
		if mine { // not taken: close it once the dial ends
			go func() {
				<-a.done
				if a.conn != nil {
					a.conn.Close()
				}
			}()
		}
	}
}

// DialContext takes the connection started ahead for addr, waiting for its
// dial, or dials addr when none was started (or it failed).
func (d *dialAhead) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	a := d.ahead[addr]
	if a != nil {
		delete(d.ahead, addr) // one request per connection: it is ours now
	}
	d.mu.Unlock()
	if a != nil {
		select {
		case <-a.done:
			if a.err == nil {
				return a.conn, nil
			}
		case <-ctx.Done():
			go func() {
				<-a.done
				if a.conn != nil {
					a.conn.Close()
				}
			}()
			return nil, ctx.Err()
		}
	}
	return d.dialer.DialContext(ctx, network, addr)
}
