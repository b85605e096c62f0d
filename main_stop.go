package main

import (
	"log/slog"
	"time"
)

// stopList is what serve has started, in the order it started: every way
// out of serve (a start that fails, a signal, loops that died) runs it
// once, last first, so that no path closes anything by hand and each
// part stops before what it was built on (VictoriaMetrics' app main: init
// in order, stop in reverse, each phase logged with its duration).
type stopList struct {
	log   *slog.Logger
	steps []stopStep
}

type stopStep struct {
	name string
	stop func()
}

// add registers how to stop the part just started.
func (s *stopList) add(name string, stop func()) {
	s.steps = append(s.steps, stopStep{name, stop})
}

// run stops everything added, last first, logging "stopped NAME" with how
// long each took. A second run does nothing.
func (s *stopList) run() {
	for i := len(s.steps) - 1; i >= 0; i-- {
		st := s.steps[i]
		t0 := time.Now()
		st.stop()
		s.log.Info("stopped "+st.name, "took", time.Since(t0))
	}
	s.steps = nil
}
