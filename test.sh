#!/usr/bin/env bash
# The one command that runs every test of github.com/rolter/caddy-ratelimit:
#
#   ./test.sh [extra go test args, e.g. -run TestX -v]
#
# 1. installs redis-server (apt) when it is missing,
# 2. starts a throwaway redis-server on a free loopback port and exports
#    ROLTER_TEST_REDIS_URL, which enables the Redis tests (they never skip then),
# 3. go vet ./... and go test -race -count=1 ./...,
# 4. builds Caddy with the plugin the way operators do (xcaddy) and checks that
#    the module is in it.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"

CADDY_VERSION=v2.11.9
MODULE=github.com/rolter/caddy-ratelimit
MODULE_ID=http.handlers.rolter_ratelimit

section() { printf '\n==== %s ====\n' "$*"; }
die() { printf 'test.sh: FAIL: %s\n' "$*" >&2; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/rolter-test.XXXXXX")
redis_pid=
cleanup() {
	if [[ -n $redis_pid ]]; then
		kill "$redis_pid" 2>/dev/null || true
		wait "$redis_pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

as_root() {
	if [[ $(id -u) -eq 0 ]]; then
		"$@"
	elif command -v sudo >/dev/null; then
		sudo "$@"
	else
		die "need root (or sudo) to run: $*"
	fi
}

apt_install() {
	as_root apt-get update
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
}

section "Prerequisites"
command -v go >/dev/null || die "go is not on PATH"
go version
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
# go test -race needs cgo, hence a C compiler.
command -v gcc >/dev/null || missing+=(gcc libc6-dev)
if ((${#missing[@]})); then
	echo "installing: ${missing[*]}"
	apt_install "${missing[@]}"
fi
redis-server --version

section "Starting a throwaway redis-server"
port_is_free() {
	# Something listening on the port accepts this connection.
	! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}
start_redis() { # port dir: starts redis-server, 0 once it answers PING
	local port=$1 dir=$2 i pid
	mkdir -p "$dir"
	redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
		--daemonize no --dir "$dir" --logfile "$dir/redis.log" &
	redis_pid=$!
	for ((i = 0; i < 100; i++)); do # 5 s
		if [[ $(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null) == PONG ]]; then
			# Ours, not another server that took the port first?
			pid=$(redis-cli -h 127.0.0.1 -p "$port" info server 2>/dev/null | tr -d '\r' | sed -n 's/^process_id://p')
			[[ $pid == "$redis_pid" ]] && return 0
			echo "port $port is served by process $pid, not by our redis-server $redis_pid"
			break
		fi
		kill -0 "$redis_pid" 2>/dev/null || break # exited, e.g. port taken
		sleep 0.05
	done
	kill "$redis_pid" 2>/dev/null || true
	wait "$redis_pid" 2>/dev/null || true
	redis_pid=
	return 1
}
redis_port=
for attempt in 1 2 3 4 5; do
	port=$((20000 + RANDOM % 40000))
	port_is_free "$port" || continue
	if start_redis "$port" "$tmp/redis"; then
		redis_port=$port
		break
	fi
	echo "redis-server did not come up on port $port (attempt $attempt):"
	tail -n 5 "$tmp/redis/redis.log" 2>/dev/null || true
done
[[ -n $redis_port ]] || die "could not start redis-server"
export ROLTER_TEST_REDIS_URL="redis://127.0.0.1:$redis_port/0"
echo "ROLTER_TEST_REDIS_URL=$ROLTER_TEST_REDIS_URL (pid $redis_pid)"

section "go vet ./..."
go vet ./...

section "go test -race -count=1 ./... $*"
go test -race -count=1 ./... "$@"

section "xcaddy build $CADDY_VERSION --with $MODULE"
go tool xcaddy build "$CADDY_VERSION" --with "$MODULE@v0.0.0=." --output "$tmp/caddy"
modules=$("$tmp/caddy" list-modules) || die "caddy list-modules failed"
if ! grep -Fxq "$MODULE_ID" <<<"$modules"; then
	die "$MODULE_ID is not among the modules of the xcaddy-built Caddy"
fi
echo "ok: $MODULE_ID is in the xcaddy-built Caddy"

section "All tests passed"
