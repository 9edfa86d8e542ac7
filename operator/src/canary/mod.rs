//! Canary rollouts gated on the proxies' P99 latency and 5xx rate.

pub mod spec;
