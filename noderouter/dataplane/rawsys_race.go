//go:build race

package dataplane

import "syscall"

// rawRead and rawWrite under the race detector: syscall.Read and Write,
// which tell it what the kernel read from and wrote into p (RawSyscall is
// invisible to it). The same results; only the raw path's speed is lost.
func rawRead(fd uintptr, p []byte) (int, error) {
	for {
		n, err := syscall.Read(int(fd), p)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		return n, nil
	}
}

func rawWrite(fd uintptr, p []byte) (int, error) {
	n, err := syscall.Write(int(fd), p)
	if err != nil {
		return 0, err
	}
	return n, nil
}
