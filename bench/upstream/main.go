// Command upstream is the benchmark's stand-in for an LLM API: it answers
// every request with a small OpenAI chat.completion carrying a usage object,
// as fast as net/http allows. It listens on a loopback address (-addr; port 0
// picks a free one) and prints the address it listens on as its first line.
package main

import (
	_ "embed"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"time"
)

// body is the answer; the package's BenchmarkHandler answers it too.
//
//go:embed completion.json
var body string

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "loopback address to listen on")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ln.Addr())
	length := strconv.Itoa(len(body))
	srv := &http.Server{
		ReadHeaderTimeout: 10 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, err := io.Copy(io.Discard, r.Body); err != nil {
				return // the gateway went away: nothing to answer
			}
			h := w.Header()
			h["Content-Type"] = []string{"application/json"}
			h["Content-Length"] = []string{length}
			_, _ = io.WriteString(w, body) // a failed write is the gateway's to see
		}),
	}
	log.Fatal(srv.Serve(ln))
}
