//! Propagating ProxyDeployments to member clusters.

pub mod spec;
