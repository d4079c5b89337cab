package inbox_test

// An infrastructure error is not a failed attempt (inbox/CONTRACT.md, "Attempts and outages"):
// the database is made unreachable through a TCP proxy (the shared server itself keeps running).

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	inbox "github.com/outbox-relay/outbox-relay/inbox/go"
)

// dbProxy forwards a local port to the database server; down closes the listener and cuts every
// open connection (the database is unreachable: connections are refused), up listens again on
// the same port.
type dbProxy struct {
	t      *testing.T
	target string
	addr   string
	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]struct{}
}

func newDBProxy(t *testing.T, target string) *dbProxy {
	t.Helper()
	p := &dbProxy{t: t, target: target, conns: map[net.Conn]struct{}{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(p.down)
	return p
}

func (p *dbProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return // closed by down
			}
			go p.pipe(c)
		}
	}()
}

func (p *dbProxy) pipe(c net.Conn) {
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	if p.ln == nil { // went down meanwhile
		p.mu.Unlock()
		_, _ = c.Close(), s.Close()
		return
	}
	p.conns[c], p.conns[s] = struct{}{}, struct{}{}
	p.mu.Unlock()
	go func() { _, _ = io.Copy(s, c); _, _ = s.Close(), c.Close() }()
	_, _ = io.Copy(c, s)
	_, _ = s.Close(), c.Close()
}

func (p *dbProxy) down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		_ = c.Close()
	}
	clear(p.conns)
}

func (p *dbProxy) up() {
	p.t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatalf("listen again on %s: %v", p.addr, err)
	}
	p.serve(ln)
}

// proxied opens the test's database through the proxy.
func (e *env) proxied(t *testing.T, p *dbProxy) *sql.DB {
	t.Helper()
	var name string
	if err := e.db.QueryRow("SELECT DATABASE()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	mc := dbConfig(name)
	mc.Addr = p.addr
	mc.Timeout = 5 * time.Second
	db, err := sql.Open("mysql", mc.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// dlqEnd is the dead-letter topic's end offset (0: nothing was ever dead-lettered).
func (e *env) dlqEnd(t *testing.T, adm *kadm.Client) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	offs, err := adm.ListEndOffsets(ctx, e.dlq)
	if err != nil {
		t.Fatal(err)
	}
	o, ok := offs.Lookup(e.dlq, 0)
	if !ok || o.Err != nil {
		t.Fatalf("end offset of %s: %v", e.dlq, o.Err)
	}
	return o.Offset
}

func startRunner(t *testing.T, db *sql.DB, s inbox.Settings, h inbox.Handler, cfg inbox.RunnerConfig) (context.CancelFunc, chan error) {
	t.Helper()
	r, err := inbox.NewRunner(db, s, h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(stop)
	return stop, done
}

func (e *env) effectsOnce(t *testing.T, n int) {
	t.Helper()
	for i := range n {
		key := fmt.Sprintf("e-%d", i)
		if got := e.effects(t, key); got != 1 {
			t.Errorf("%s: %d effects, want 1", key, got)
		}
	}
	if got := e.count(t, "SELECT COUNT(*) FROM effects"); got != n {
		t.Errorf("%d effects in all, want %d", got, n)
	}
}

// The database is unreachable for far longer than max_attempts × backoff (3 attempts, 10 and
// 20 ms: 30 ms) while records arrive; when it is back every record is processed once, none is
// dead-lettered, and the offsets are committed.
func TestOutageIsNotAnAttempt(t *testing.T) {
	e := newEnv(t, 1)
	px := newDBProxy(t, dbConfig("").Addr)
	db := e.proxied(t, px)
	group := "inbox-go-group-" + randSuffix()
	adm := kadm.NewClient(newClient(t))
	t.Cleanup(func() { _, _ = adm.DeleteGroups(context.Background(), group) })
	s := e.settings()
	s.BackoffInitial, s.BackoffMax = 10*time.Millisecond, 20*time.Millisecond
	cfg := inbox.RunnerConfig{Brokers: strings.Split(bootstrap, ","), Topics: []string{e.topic}, Group: group}
	stop, done := startRunner(t, db, s, effectHandler(new(atomic.Int32), nil), cfg)

	produce(t, e.producer, e.topic, 0, 0, 3)
	eventually(t, "offset 3 committed", func() bool { return committed(t, adm, group, e.topic) == 3 })
	px.down()
	produce(t, e.producer, e.topic, 0, 3, 8)
	// The outage itself lasts a fixed time (the stimulus, not a wait for a result): 2 s, about
	// 70 times the old retry budget.
	time.Sleep(2 * time.Second)
	if c := committed(t, adm, group, e.topic); c != 3 {
		t.Errorf("committed offset %d during the outage, want 3", c)
	}
	px.up()
	eventually(t, "offset 8 committed", func() bool { return committed(t, adm, group, e.topic) == 8 })
	stop()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	e.effectsOnce(t, 8)
	if n := e.dlqEnd(t, adm); n != 0 {
		t.Errorf("%d dead letters, want none", n)
	}
}

// An outage longer than the outage budget stops the runner with an *OutageError, nothing past
// the last processed record committed; a restarted runner processes the rest once.
func TestOutageLongerThanTheBudgetStopsTheRunner(t *testing.T) {
	e := newEnv(t, 1)
	px := newDBProxy(t, dbConfig("").Addr)
	db := e.proxied(t, px)
	group := "inbox-go-group-" + randSuffix()
	adm := kadm.NewClient(newClient(t))
	t.Cleanup(func() { _, _ = adm.DeleteGroups(context.Background(), group) })
	s := e.settings()
	s.OutageBudget = time.Second
	cfg := inbox.RunnerConfig{Brokers: strings.Split(bootstrap, ","), Topics: []string{e.topic}, Group: group}
	_, done := startRunner(t, db, s, effectHandler(new(atomic.Int32), nil), cfg)

	produce(t, e.producer, e.topic, 0, 0, 3)
	eventually(t, "offset 3 committed", func() bool { return committed(t, adm, group, e.topic) == 3 })
	px.down()
	produce(t, e.producer, e.topic, 0, 3, 6)
	var err error
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the runner did not stop after an outage longer than its budget")
	}
	var outage *inbox.OutageError
	if !errors.As(err, &outage) || outage.Offset != 3 || outage.Partition != 0 || outage.Topic != e.topic {
		t.Fatalf("run: %v (%T), want an *inbox.OutageError at offset 3", err, err)
	}
	if !inbox.IsInfrastructureError(err) {
		t.Errorf("the outage error does not wrap an infrastructure error: %v", err)
	}
	if c := committed(t, adm, group, e.topic); c != 3 {
		t.Errorf("committed offset %d after the outage, want 3", c)
	}
	px.up()
	stop2, done2 := startRunner(t, db, e.settings(), effectHandler(new(atomic.Int32), nil), cfg)
	eventually(t, "offset 6 committed", func() bool { return committed(t, adm, group, e.topic) == 6 })
	stop2()
	if err := <-done2; err != nil {
		t.Fatalf("run 2: %v", err)
	}
	e.effectsOnce(t, 6)
	if n := e.dlqEnd(t, adm); n != 0 {
		t.Errorf("%d dead letters, want none", n)
	}
}
