package main

import (
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/paystream/paystream/bench/internal/rig"
)

// threadsCPU reads each thread's CPU time by name: over every thread (the
// empty name matches all) it grows as the process's CPU time does, and a
// name no thread has matches none.
func TestThreadsCPU(t *testing.T) {
	pid := os.Getpid()
	all0, process0 := threadsCPU(pid, ""), rig.ProcessCPU(pid)

	// Burn CPU on two threads that stay alive until the end (a thread that
	// exits leaves its time in the process's total but not in its tasks),
	// until the process has used 400 ms more, however busy the machine.
	burnt, release := make(chan struct{}), make(chan struct{})
	for range 2 {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			for deadline := time.Now().Add(time.Minute); rig.ProcessCPU(pid)-process0 < 400*time.Millisecond && time.Now().Before(deadline); {
				for x := 0; x < 1_000_000; x++ {
					_ = x
				}
			}
			burnt <- struct{}{}
			<-release
		}()
	}
	<-burnt
	<-burnt
	all, process := threadsCPU(pid, "")-all0, rig.ProcessCPU(pid)-process0
	close(release)

	if all < 300*time.Millisecond {
		t.Fatalf("threadsCPU over every thread grew by %v while the process used %v, want ≥ 300ms", all, process)
	}
	// Each thread's time is rounded to a tick: allow a few per thread.
	if d := (all - process).Abs(); d > 20*rig.ClockTick {
		t.Fatalf("threadsCPU over every thread grew by %v, the process's CPU by %v: want about equal", all, process)
	}
	if n := threadsCPU(pid, "no thread is called this"); n != 0 {
		t.Fatalf("threadsCPU for a name no thread has = %v, want 0", n)
	}
	if n := threadsCPU(-1, ""); n != 0 {
		t.Fatalf("threadsCPU of no process = %v, want 0", n)
	}
}
