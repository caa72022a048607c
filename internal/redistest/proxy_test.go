package redistest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/rolter/caddy-ratelimit/internal/poll"
)

// TestResetProxyKillsConnectionAtNextCommand checks the proxy against go-redis
// with both protocols. With RESP3 (go-redis's default) the reset surfaces as
// io.EOF, not ECONNRESET: before reading a reply go-redis peeks for push
// notifications, that peek consumes the socket's ECONNRESET and its error is
// ignored, and the reply read then finds end of file. Callers classifying
// "connection lost mid-command" must accept both.
func TestResetProxyKillsConnectionAtNextCommand(t *testing.T) {
	r := NewServer(t)
	for _, tc := range []struct {
		protocol int
		want     error
	}{
		{2, syscall.ECONNRESET},
		{3, io.EOF},
	} {
		t.Run(fmt.Sprintf("RESP%d", tc.protocol), func(t *testing.T) {
			checkResetProxy(t, r.Addr(), tc.protocol, tc.want)
		})
	}
}

func checkResetProxy(t *testing.T, redisAddr string, protocol int, wantErr error) {
	p := NewResetProxy(t, redisAddr)
	c := redis.NewClient(&redis.Options{
		Addr:                     p.Addr(),
		Protocol:                 protocol,
		PoolSize:                 1,
		MaxRetries:               -1,
		DialerRetries:            1,
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING through the proxy: %v", err)
	}
	id1, err := c.ClientID(ctx).Result()
	if err != nil {
		t.Fatalf("CLIENT ID: %v", err)
	}
	if n := p.Connections(); n != 1 {
		t.Fatalf("proxy has %d connections, want 1", n)
	}

	p.ResetAtNextCommand()
	err = c.Ping(ctx).Err()
	if err == nil {
		t.Fatal("PING on the armed connection succeeded, want it to fail")
	}
	if !errors.Is(err, wantErr) {
		t.Fatalf("PING on the armed connection: got %v (%T), want %v", err, err, wantErr)
	}

	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING on a new connection after the reset: %v", err)
	}
	id2, err := c.ClientID(ctx).Result()
	if err != nil {
		t.Fatalf("CLIENT ID after the reset: %v", err)
	}
	if id2 == id1 {
		t.Fatalf("still on connection %d after the reset, want a new one", id1)
	}
	err = poll.Until(2*time.Second, pollEvery, func() error {
		if n := p.Connections(); n != 1 {
			return fmt.Errorf("proxy has %d connections after the reset, want 1", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
