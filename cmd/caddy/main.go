// Command caddy is Caddy's standard main with the rolter_ratelimit module
// plugged in, for development:
//
//	go run ./cmd/caddy run --config Caddyfile.example
//
// Operators build with xcaddy instead (see test.sh):
//
//	xcaddy build v2.11.9 --with github.com/rolter/caddy-ratelimit
package main

import (
	_ "time/tzdata"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	// plug in Caddy modules here
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/rolter/caddy-ratelimit"
)

func main() {
	caddycmd.Main()
}
