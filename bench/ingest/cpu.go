package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/paystream/paystream/bench/internal/rig"
	"github.com/paystream/paystream/internal/lab/loadgen"
)

// cpuPerRequest returns the CPU microseconds (bench process and broker)
// one request of r cost.
func cpuPerRequest(c cpuUse, r *loadgen.Result) float64 {
	if r.Throughput() == 0 {
		return 0
	}
	return (c.process + c.broker) * 1e6 / r.Throughput()
}

// cpuSample is the CPU time used so far by this process, the broker and
// the whole machine, and when.
type cpuSample struct {
	at                     time.Time
	process, broker, total time.Duration
}

// cpuUse is CPU used over an interval, in cores (1.0 = one core busy).
type cpuUse struct{ process, broker, machine float64 }

// add returns u plus o weighted by its duration d, for per.
func (u cpuUse) add(o cpuUse, d time.Duration) cpuUse {
	s := d.Seconds()
	return cpuUse{u.process + o.process*s, u.broker + o.broker*s, u.machine + o.machine*s}
}

// per turns a sum of add calls back into cores over total.
func (u cpuUse) per(total time.Duration) cpuUse {
	s := total.Seconds()
	if s <= 0 {
		return cpuUse{}
	}
	return cpuUse{u.process / s, u.broker / s, u.machine / s}
}

func readCPU(brokerPID int) cpuSample {
	s := cpuSample{at: time.Now()}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.process = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	// /proc/stat's first line: cpu user nice system idle iowait irq softirq steal guest guest_nice.
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		fields := strings.Fields(line)
		var busy int64
		for i := 1; i < len(fields) && i <= 8; i++ {
			if i == 4 || i == 5 { // idle, iowait
				continue
			}
			n, _ := strconv.ParseInt(fields[i], 10, 64)
			busy += n
		}
		s.total = time.Duration(busy) * rig.ClockTick
	}
	if brokerPID > 0 {
		s.broker = rig.ProcessCPU(brokerPID)
	}
	return s
}

func (s cpuSample) since(before cpuSample) cpuUse {
	wall := s.at.Sub(before.at).Seconds()
	if wall <= 0 {
		return cpuUse{}
	}
	return cpuUse{
		process: (s.process - before.process).Seconds() / wall,
		broker:  (s.broker - before.broker).Seconds() / wall,
		machine: (s.total - before.total).Seconds() / wall,
	}
}
