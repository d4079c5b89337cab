package inbox

import (
	"errors"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the inbox's Prometheus series (inbox/CONTRACT.md, "Metrics"); a nil *metrics
// records nothing (no Settings.Registerer).
type metrics struct {
	records      *prometheus.CounterVec
	parked       *prometheus.GaugeVec
	parkedOldest *prometheus.GaugeVec
	lag          *prometheus.GaugeVec
}

// newMetrics registers the series with reg (nil: no metrics). A series already registered
// with the same definition (another inbox on the same registry) is shared.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_inbox_records_total",
			Help: "Records settled by the inbox, by consumer, original topic and outcome.",
		}, []string{"consumer", "topic", "outcome"}),
		parked: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "outbox_inbox_parked_records",
			Help: "Parked rows of the consumer at the last sweep.",
		}, []string{"consumer"}),
		parkedOldest: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "outbox_inbox_parked_oldest_seconds",
			Help: "Age of the consumer's oldest parked row at the last sweep (0: none).",
		}, []string{"consumer"}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "outbox_inbox_consumer_lag",
			Help: "The partition's high watermark minus the consumer's position, after each poll.",
		}, []string{"consumer", "topic", "partition"}),
	}
	var err error
	if m.records, err = register(reg, m.records); err != nil {
		return nil, err
	}
	if m.parked, err = register(reg, m.parked); err != nil {
		return nil, err
	}
	if m.parkedOldest, err = register(reg, m.parkedOldest); err != nil {
		return nil, err
	}
	if m.lag, err = register(reg, m.lag); err != nil {
		return nil, err
	}
	return m, nil
}

// register registers c, or returns the collector already registered in its place.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	if err != nil {
		return c, errors.New("inbox: registering the metrics: " + err.Error())
	}
	return c, nil
}

// settled counts a settled record (topic: its original topic).
func (m *metrics) settled(consumer, topic string, out Outcome) {
	if m == nil || out == "" {
		return
	}
	m.records.WithLabelValues(consumer, topic, string(out)).Inc()
}

// swept sets the parked gauges after a sweep.
func (m *metrics) swept(consumer string, parked int, oldest time.Duration) {
	if m == nil {
		return
	}
	m.parked.WithLabelValues(consumer).Set(float64(parked))
	m.parkedOldest.WithLabelValues(consumer).Set(oldest.Seconds())
}

// setLag sets a partition's lag after a poll.
func (m *metrics) setLag(consumer, topic string, partition int32, lag int64) {
	if m == nil {
		return
	}
	m.lag.WithLabelValues(consumer, topic, strconv.FormatInt(int64(partition), 10)).Set(float64(max(lag, 0)))
}
