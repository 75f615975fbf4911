//go:build linux

package localaddr

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"skipper.dev/skipper/internal/tick"
)

// Names of what Ensure creates.
const (
	// DummyLink is the dummy link the address lives on when the kernel
	// supports dummy links.
	DummyLink = "skipper0"
	// LoopbackLabel labels the address on lo otherwise (a label must start
	// with its link's name).
	LoopbackLabel = "lo:skipper"
)

// Where the address lives.
type Where string

const (
	WhereNone     Where = ""
	WhereDummy    Where = "dummy " + DummyLink
	WhereLoopback Where = "lo as " + LoopbackLabel
)

// Observed is what is on the node, as far as the address is concerned.
type Observed struct {
	// DummyUnsupported: creating a dummy link failed with EOPNOTSUPP.
	DummyUnsupported bool
	DummyExists      bool
	DummyUp          bool
	DummyHasAddr     bool // the wanted address is on skipper0
	LoUp             bool
	LoHasAddr        bool // the wanted address is on lo with LoopbackLabel
}

// Actions are the changes that bring the node to the wanted state, applied
// in the order of the fields.
type Actions struct {
	CreateDummy  bool
	SetDummyUp   bool
	AddDummyAddr bool
	SetLoUp      bool
	AddLoAddr    bool
	// RemoveLoAddr drops a labelled address left on lo once skipper0
	// carries it.
	RemoveLoAddr bool
}

// None reports whether a is empty.
func (a Actions) None() bool { return a == Actions{} }

// Plan returns what to change so the address is on skipper0 (or on lo when
// dummy links are unsupported). Pure: no I/O.
func Plan(o Observed) (Actions, Where) {
	var a Actions
	if o.DummyUnsupported {
		a.SetLoUp = !o.LoUp
		a.AddLoAddr = !o.LoHasAddr
		return a, WhereLoopback
	}
	if !o.DummyExists {
		a.CreateDummy, a.SetDummyUp, a.AddDummyAddr = true, true, true
	} else {
		a.SetDummyUp = !o.DummyUp
		a.AddDummyAddr = !o.DummyHasAddr
	}
	a.RemoveLoAddr = o.LoHasAddr
	return a, WhereDummy
}

// Manager keeps Addr on the node. The zero value of each optional field is
// replaced by the stated default. Methods may be called from any goroutine;
// they serialise.
type Manager struct {
	// Addr is the IPv4 address to keep (as a /32). Required.
	Addr netip.Addr
	// Handle is the netlink handle to use; nil: the process's network
	// namespace.
	Handle *netlink.Handle

	mu               sync.Mutex
	dummyUnsupported bool
}

func (m *Manager) h() *netlink.Handle {
	if m.Handle != nil {
		return m.Handle
	}
	return &netlink.Handle{} // the netlink package's own default handle
}

func (m *Manager) addr(label string) (*netlink.Addr, error) {
	if !m.Addr.Is4() {
		return nil, fmt.Errorf("local address %v is not IPv4", m.Addr)
	}
	return &netlink.Addr{IPNet: &net.IPNet{IP: m.Addr.AsSlice(), Mask: net.CIDRMask(32, 32)}, Label: label}, nil
}

// Ensure makes the address present and returns where it lives and what it
// changed (empty when nothing was missing).
func (m *Manager) Ensure() (Where, Actions, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.addr(""); err != nil {
		return WhereNone, Actions{}, err
	}
	o, err := m.observe()
	if err != nil {
		return WhereNone, Actions{}, err
	}
	a, where := Plan(o)
	err = m.apply(a)
	if a.CreateDummy && errors.Is(err, unix.EOPNOTSUPP) {
		// CONFIG_DUMMY off: remember it and fall back to lo.
		m.dummyUnsupported = true
		if o, err = m.observe(); err != nil {
			return WhereNone, a, err
		}
		a, where = Plan(o)
		err = m.apply(a)
	}
	if err != nil {
		return WhereNone, a, fmt.Errorf("ensure local address %v on %s: %w", m.Addr, where, err)
	}
	return where, a, nil
}

func (m *Manager) observe() (Observed, error) {
	h := m.h()
	o := Observed{DummyUnsupported: m.dummyUnsupported}
	d, err := h.LinkByName(DummyLink)
	var nf netlink.LinkNotFoundError
	switch {
	case errors.As(err, &nf):
	case err != nil:
		return o, fmt.Errorf("look up %s: %w", DummyLink, err)
	default:
		o.DummyExists = true
		o.DummyUp = d.Attrs().Flags&net.FlagUp != 0
		if o.DummyHasAddr, err = m.hasAddr(d, ""); err != nil {
			return o, err
		}
	}
	lo, err := h.LinkByName("lo")
	if err != nil {
		return o, fmt.Errorf("look up lo: %w", err)
	}
	o.LoUp = lo.Attrs().Flags&net.FlagUp != 0
	if o.LoHasAddr, err = m.hasAddr(lo, LoopbackLabel); err != nil {
		return o, err
	}
	return o, nil
}

// hasAddr reports whether l carries the address (with label, when given).
func (m *Manager) hasAddr(l netlink.Link, label string) (bool, error) {
	addrs, err := m.h().AddrList(l, unix.AF_INET)
	if err != nil {
		return false, fmt.Errorf("list addresses of %s: %w", l.Attrs().Name, err)
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if ok && ip.Unmap() == m.Addr && (label == "" || a.Label == label) {
			return true, nil
		}
	}
	return false, nil
}

func (m *Manager) apply(a Actions) error {
	h := m.h()
	if a.CreateDummy {
		if err := h.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: DummyLink}}); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("create dummy link %s: %w", DummyLink, err)
		}
	}
	if a.SetDummyUp || a.AddDummyAddr {
		d, err := h.LinkByName(DummyLink)
		if err != nil {
			return fmt.Errorf("look up %s: %w", DummyLink, err)
		}
		if a.SetDummyUp {
			if err := h.LinkSetUp(d); err != nil {
				return fmt.Errorf("set %s up: %w", DummyLink, err)
			}
		}
		if a.AddDummyAddr {
			if err := m.addAddr(d, DummyLink); err != nil {
				return err
			}
		}
	}
	if a.SetLoUp || a.AddLoAddr || a.RemoveLoAddr {
		lo, err := h.LinkByName("lo")
		if err != nil {
			return fmt.Errorf("look up lo: %w", err)
		}
		if a.SetLoUp {
			if err := h.LinkSetUp(lo); err != nil {
				return fmt.Errorf("set lo up: %w", err)
			}
		}
		if a.AddLoAddr {
			if err := m.addAddr(lo, LoopbackLabel); err != nil {
				return err
			}
		}
		if a.RemoveLoAddr {
			if err := m.delAddr(lo, LoopbackLabel); err != nil {
				return err
			}
		}
	}
	return nil
}

func (m *Manager) addAddr(l netlink.Link, label string) error {
	a, err := m.addr(label)
	if err != nil {
		return err
	}
	if err := m.h().AddrAdd(l, a); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add %v to %s: %w", m.Addr, l.Attrs().Name, err)
	}
	return nil
}

func (m *Manager) delAddr(l netlink.Link, label string) error {
	a, err := m.addr(label)
	if err != nil {
		return err
	}
	if err := m.h().AddrDel(l, a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
		return fmt.Errorf("remove %v from %s: %w", m.Addr, l.Attrs().Name, err)
	}
	return nil
}

// Remove deletes skipper0 and the labelled address on lo, whichever exist.
func (m *Manager) Remove() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	h := m.h()
	var errs []error
	d, err := h.LinkByName(DummyLink)
	var nf netlink.LinkNotFoundError
	switch {
	case errors.As(err, &nf):
	case err != nil:
		errs = append(errs, fmt.Errorf("look up %s: %w", DummyLink, err))
	default:
		if err := h.LinkDel(d); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", DummyLink, err))
		}
	}
	if m.Addr.IsValid() {
		lo, err := h.LinkByName("lo")
		if err != nil {
			errs = append(errs, fmt.Errorf("look up lo: %w", err))
		} else if has, err := m.hasAddr(lo, LoopbackLabel); err != nil {
			errs = append(errs, err)
		} else if has {
			errs = append(errs, m.delAddr(lo, LoopbackLabel))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove local address %v: %w", m.Addr, err)
	}
	return nil
}

// Run calls Ensure every interval until ctx ends, logging what it had to
// restore and any error (the next tick tries again).
func (m *Manager) Run(ctx context.Context, interval time.Duration, log *slog.Logger) {
	tick.After(ctx, interval, func(time.Time) {
		where, a, err := m.Ensure()
		switch {
		case err != nil:
			log.Warn("reconcile local address", "addr", m.Addr.String(), "err", err)
		case !a.None():
			log.Info("restored local address", "addr", m.Addr.String(), "on", string(where), "changes", fmt.Sprintf("%+v", a))
		}
	})
}
