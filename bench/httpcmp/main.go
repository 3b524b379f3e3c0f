package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"
)

var n atomic.Int64
var sleep *time.Duration
var answer = []byte(`{"received":true}` + "\n")

func cpu() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func main() {
	mode := flag.String("mode", "net", "net|netbare|fast")
	addr := flag.String("addr", "127.0.0.1:18080", "")
	sleep = flag.Duration("sleep", 0, "")
	flag.Parse()
	ln, _ := net.Listen("tcp", *addr)
	switch *mode {
	case "net", "netbare":
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			_ = b
			n.Add(1)
			if *sleep > 0 {
				time.Sleep(*sleep)
			}
			w.Header()["Content-Type"] = []string{"application/json"}
			w.WriteHeader(200)
			w.Write(answer)
		})
		var hh http.Handler = h
		srv := &http.Server{Handler: hh}
		if *mode == "net" {
			r := chi.NewRouter()
			r.Post("/webhooks/{source}", h)
			srv = &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 60 * time.Second, IdleTimeout: 90 * time.Second}
		}
		go srv.Serve(ln)
	case "adapt":
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			_ = b
			n.Add(1)
			if *sleep > 0 {
				time.Sleep(*sleep)
			}
			w.Header()["Content-Type"] = []string{"application/json"}
			w.WriteHeader(200)
			w.Write(answer)
		})
		r := chi.NewRouter()
		r.Post("/webhooks/{source}", h)
		srv := &fasthttp.Server{Handler: fasthttpadaptor.NewFastHTTPHandler(r), ReadTimeout: 30 * time.Second, WriteTimeout: 60 * time.Second, IdleTimeout: 90 * time.Second}
		go srv.Serve(ln)
	case "fast":
		srv := &fasthttp.Server{Handler: func(c *fasthttp.RequestCtx) {
			_ = c.PostBody()
			n.Add(1)
			if *sleep > 0 {
				time.Sleep(*sleep)
			}
			c.SetContentType("application/json")
			c.SetBody(answer)
		}, ReadTimeout: 30 * time.Second, WriteTimeout: 60 * time.Second, IdleTimeout: 90 * time.Second}
		go srv.Serve(ln)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1, syscall.SIGTERM)
	var c0 time.Duration
	var n0 int64
	for s := range sig {
		if s == syscall.SIGUSR1 {
			c0, n0 = cpu(), n.Load()
			continue
		}
		c, k := cpu()-c0, n.Load()-n0
		fmt.Printf("%s: %d requests, %.1f µs CPU/request\n", *mode, k, float64(c.Microseconds())/float64(k))
		return
	}
}
