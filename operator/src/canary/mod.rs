//! Canary rollouts gated on the proxies' P99 latency and 5xx rate.
//!
//! `machine` is the pure state machine; `analysis` judges windows; `source` gets the numbers
//! (direct scraping or Prometheus); `rollout` is the I/O shell the controller calls.

pub mod analysis;
pub mod machine;
pub mod rollout;
pub mod source;
pub mod spec;
pub mod tree;

#[cfg(test)]
mod machine_props;
#[cfg(test)]
mod machine_tests;
