// Command bodyflood measures what a client that holds request bodies back
// costs the other clients of a gateway (issue 39, point 3). Against a
// gateway on 127.0.0.1 whose chain reads bodies, it opens attack
// connections from another loopback address, each sending a chat request's
// headers claiming a 4 MiB body and sent bytes of it (0: headers only),
// then nothing; meanwhile a normal client at 127.0.0.1 posts a body of
// -size bytes, one request after another, sent as fast as loopback allows.
// It prints the body memory the gateway holds (its gauge, sampled every
// 100 ms) and the normal client's outcomes and latencies.
//
//	bodyflood -url http://127.0.0.1:8080 -metrics http://127.0.0.1:2019/metrics -conns 4200
//	bodyflood -url ... -metrics ... -conns 16 -sent 2100000
//
// It targets loopback only, with at most 5000 connections for at most a
// minute.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

func main() {
	target := flag.String("url", "", "the gateway's site, http://127.0.0.1:port")
	metrics := flag.String("metrics", "", "Caddy's metrics, http://127.0.0.1:port/metrics")
	conns := flag.Int("conns", 4200, "attack connections (at most 5000)")
	sent := flag.Int("sent", 0, "bytes of its body each attack connection sends before it stalls")
	from := flag.String("from", "127.0.0.2", "the loopback address the attack connections come from")
	size := flag.Int("size", 16<<10, "bytes of the normal client's body")
	duration := flag.Duration("duration", 10*time.Second, "how long the normal client posts while the attack runs (at most 1m)")
	flag.Parse()
	u, err := url.Parse(*target)
	m, merr := url.Parse(*metrics)
	if err != nil || merr != nil || u.Hostname() != "127.0.0.1" || !loopback(m.Hostname()) || !net.ParseIP(*from).IsLoopback() {
		log.Fatal("-url must be http://127.0.0.1:port, -metrics on localhost and -from a loopback address")
	}
	if *conns > 5000 || *duration > time.Minute || *sent > 4194300 {
		log.Fatal("at most 5000 connections, 1m and 4194300 bytes each")
	}

	stop := make(chan struct{})
	var samples []float64
	var sampled sync.WaitGroup
	sampled.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if v, ok := gauge(*metrics, "caddy_rolter_ratelimit_request_body_bytes"); ok {
					samples = append(samples, v)
				}
			}
		}
	})

	statuses := make(chan string, *conns)
	open := make([]net.Conn, 0, *conns)
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(*from)}}
	for i := range *conns {
		c, err := d.Dial("tcp", u.Host)
		if err != nil {
			log.Fatalf("attack connection %d: %v", i, err)
		}
		open = append(open, c)
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nX-Api-Key: attack-%d\r\nContent-Length: 4194300\r\n\r\n", i)
		if *sent > 0 {
			go func() { _, _ = io.WriteString(c, chat(*sent)) }() // fails only once the gateway closes it
		}
		go func() {
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				line = "closed without an answer"
			}
			statuses <- strings.TrimSpace(line)
		}()
	}
	time.Sleep(2 * time.Second) // the attack settles: its bodies are read, or wait for room
	fmt.Printf("attack: %d connections from %s, %d bytes of body each, then nothing\n", *conns, *from, *sent)
	fmt.Printf("body memory held 2 s in: %s\n", mib(last(samples)))

	client := &http.Client{Timeout: 30 * time.Second}
	body := chat(*size-4) + `"}]}`
	outcomes := map[string]int{}
	var took []time.Duration
	for end := time.Now().Add(*duration); time.Now().Before(end); {
		req, _ := http.NewRequest("POST", *target+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Api-Key", "normal-client")
		start := time.Now()
		res, err := client.Do(req)
		if err != nil {
			outcomes["error: "+err.Error()]++
			continue
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		took = append(took, time.Since(start))
		outcomes[strconv.Itoa(res.StatusCode)]++
	}
	close(stop)
	sampled.Wait()

	slices.Sort(took)
	fmt.Printf("normal client: %d-byte bodies for %v: outcomes %v\n", *size, *duration, outcomes)
	if len(took) > 0 {
		fmt.Printf("normal client latency: p50 %v, p99 %v, max %v\n", took[len(took)/2], took[len(took)*99/100], took[len(took)-1])
	}
	slices.Sort(samples)
	if len(samples) > 0 {
		fmt.Printf("body memory held while it ran: median %s, max %s\n", mib(samples[len(samples)/2]), mib(samples[len(samples)-1]))
	}
	attack := map[string]int{}
	for _, c := range open {
		c.Close()
	}
	for range open {
		s := <-statuses
		attack[s]++
	}
	fmt.Printf("attack connections' answers: %v\n", attack)
}

// chat is the first n bytes of a long chat request's JSON.
func chat(n int) string {
	head := `{"model":"m","messages":[{"role":"user","content":"`
	return (head + strings.Repeat("a", max(n-len(head), 0)))[:n]
}

// gauge reads a gauge from Caddy's metrics.
func gauge(metrics, name string) (float64, bool) {
	res, err := http.DefaultClient.Get(metrics)
	if err != nil {
		return 0, false
	}
	defer res.Body.Close()
	s := bufio.NewScanner(res.Body)
	s.Buffer(nil, 1<<20)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}

func loopback(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || ip != nil && ip.IsLoopback()
}

func last(s []float64) float64 {
	if len(s) == 0 {
		return 0
	}
	return s[len(s)-1]
}

func mib(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }
