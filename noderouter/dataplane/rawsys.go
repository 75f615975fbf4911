//go:build !race

package dataplane

import (
	"syscall"
	"unsafe"
)

// rawRead and rawWrite are read(2) and write(2) without entersyscall (see
// sock): the socket is non-blocking, they return at once. EINTR is retried
// by rawRead, returned by rawWrite (its callers loop). Race builds use
// rawsys_race.go's instead, which tell the race detector what the kernel
// wrote into a buffer.
func rawRead(fd uintptr, p []byte) (int, error) {
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(n), nil
	}
}

func rawWrite(fd uintptr, p []byte) (int, error) {
	n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}
