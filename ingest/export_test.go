package ingest

import "github.com/valyala/fasthttp"

// FastHandler is the handler of the fasthttp server Serve runs, for
// benchmarks that drive it without a connection.
func (s *Server) FastHandler() fasthttp.RequestHandler { return s.fastServer(nil).Handler }
