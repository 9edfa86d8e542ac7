//! Leader election on a coordination.k8s.io Lease, so two replicas can run and only one acts.
//! A small module rather than a crate: the logic is thirty lines, and owning it lets the
//! holder stop acting the moment a renewal deadline passes.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::Client;
use tokio::sync::watch;

pub struct LeaderElection {
    api: Api<Lease>,
    name: String,
    identity: String,
    lease_duration: Duration,
    renew_every: Duration,
}

/// What to do given a lease and the time: a pure decision.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// We hold it: renew.
    Renew,
    /// Free or expired: take it.
    Acquire,
    /// Someone else holds a live lease.
    Standby,
}

pub fn decide(spec: Option<&LeaseSpec>, identity: &str, now: Timestamp) -> Decision {
    let Some(spec) = spec else { return Decision::Acquire };
    match spec.holder_identity.as_deref() {
        Some(h) if h == identity => Decision::Renew,
        None | Some("") => Decision::Acquire,
        Some(_) => {
            let renewed = spec.renew_time.as_ref().map(|t| t.0).unwrap_or(Timestamp::UNIX_EPOCH);
            let duration = spec.lease_duration_seconds.unwrap_or(15) as i64;
            if now.as_second() > renewed.as_second() + duration {
                Decision::Acquire
            } else {
                Decision::Standby
            }
        }
    }
}

impl LeaderElection {
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity: identity.to_string(),
            lease_duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(3),
        }
    }

    async fn try_once(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let current = self.api.get_opt(&self.name).await?;
        let decision = decide(current.as_ref().and_then(|l| l.spec.as_ref()), &self.identity, now);
        if decision == Decision::Standby {
            return Ok(false);
        }
        let mut spec = current.as_ref().and_then(|l| l.spec.clone()).unwrap_or_default();
        if decision == Decision::Acquire {
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.holder_identity = Some(self.identity.clone());
        spec.lease_duration_seconds = Some(self.lease_duration.as_secs() as i32);
        spec.renew_time = Some(MicroTime(now));
        match current {
            // replace() carries the resourceVersion: a concurrent writer makes this fail.
            Some(mut lease) => {
                lease.spec = Some(spec);
                self.api.replace(&self.name, &PostParams::default(), &lease).await?;
            }
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..Default::default()
                    },
                    spec: Some(spec),
                };
                self.api.create(&PostParams::default(), &lease).await?;
            }
        }
        Ok(true)
    }

    /// Keeps trying forever; publishes whether we are the leader. Leadership is dropped as
    /// soon as a renewal has not succeeded within the lease duration.
    pub async fn run(self, leader: watch::Sender<bool>) {
        let mut last_success = tokio::time::Instant::now() - self.lease_duration;
        loop {
            match self.try_once().await {
                Ok(true) => {
                    last_success = tokio::time::Instant::now();
                    if !*leader.borrow() {
                        tracing::info!(identity = %self.identity, "acquired leader lease");
                    }
                    let _ = leader.send(true);
                }
                Ok(false) => {
                    if *leader.borrow() {
                        tracing::warn!("lost the leader lease to another replica");
                    }
                    let _ = leader.send(false);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "lease update failed");
                    if last_success.elapsed() >= self.lease_duration - self.renew_every && *leader.borrow() {
                        tracing::warn!("could not renew the lease in time; standing down");
                        let _ = leader.send(false);
                    }
                }
            }
            tokio::time::sleep(self.renew_every).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: &str, renewed: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(MicroTime(Timestamp::from_second(renewed).unwrap())),
            lease_duration_seconds: Some(15),
            ..Default::default()
        }
    }

    #[test]
    fn decisions() {
        let now = Timestamp::from_second(1000).unwrap();
        assert_eq!(decide(None, "a", now), Decision::Acquire);
        assert_eq!(decide(Some(&lease("a", 990)), "a", now), Decision::Renew);
        assert_eq!(decide(Some(&lease("b", 990)), "a", now), Decision::Standby);
        assert_eq!(decide(Some(&lease("b", 980)), "a", now), Decision::Acquire);
    }
}
