//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's
//! `leaderelection` package does it (and so ingress-nginx).
//!
//! Every replica serves traffic and configures its own nginx; only the
//! leader writes Ingress status, so two replicas never fight over it.
//!
//! The decision is pure ([`Elector::decide`]): like client-go, a follower
//! judges expiry by *its own* clock, from the moment it last saw the Lease
//! record change, never by comparing the holder's `renewTime` with local
//! time, so clock skew between nodes cannot make two leaders. Writes use the
//! Lease's `resourceVersion`: of two replicas racing for an expired Lease,
//! the apiserver lets exactly one through (the other gets 409).

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::Api;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// `--election-id`, `--election-ttl` and what client-go derives from it.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    /// The Lease's name (`--election-id`).
    pub name: String,
    /// This replica's identity: the Pod name in a cluster.
    pub identity: String,
    /// How long a Lease holds without renewal (`--election-ttl`, 30 s).
    pub lease_duration: Duration,
    /// The leader steps down if it could not renew for this long.
    pub renew_deadline: Duration,
    /// How often every replica looks at the Lease.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// ingress-nginx's derivation: renew deadline ttl/2, retry period ttl/4.
    pub fn from_ttl(namespace: String, name: String, identity: String, ttl: Duration) -> Self {
        LeaseConfig {
            namespace,
            name,
            identity,
            lease_duration: ttl,
            renew_deadline: ttl / 2,
            retry_period: ttl / 4,
        }
    }
}

/// The fields of a Lease record that decide who leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub holder: Option<String>,
    pub lease_duration: Duration,
    /// `renewTime`, as written (only compared for change, never with now).
    pub renew_time: Option<String>,
    pub transitions: i32,
}

impl Record {
    pub fn of(lease: &Lease) -> Record {
        let spec = lease.spec.clone().unwrap_or_default();
        Record {
            holder: spec.holder_identity.filter(|h| !h.is_empty()),
            lease_duration: Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64),
            renew_time: spec.renew_time.map(|t| t.0.to_string()),
            transitions: spec.lease_transitions.unwrap_or(0),
        }
    }
}

/// What to do with the Lease on this round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// No Lease exists: create it, holding it.
    Create,
    /// Write ourselves as holder; `transition` when we were not the holder.
    Take { transition: bool },
    /// Someone else holds a live Lease.
    Follow { holder: String },
}

/// The local memory of the last Lease record seen and when it was first
/// seen in that form.
#[derive(Debug, Default)]
pub struct Elector {
    observed: Option<(Record, Instant)>,
}

impl Elector {
    /// Decides from the current record (`None`: no Lease) at local time `now`.
    pub fn decide(&mut self, me: &str, current: Option<&Record>, now: Instant) -> Action {
        let Some(record) = current else {
            self.observed = None;
            return Action::Create;
        };
        let first_seen = match &self.observed {
            Some((seen, at)) if seen == record => *at,
            _ => {
                self.observed = Some((record.clone(), now));
                now
            }
        };
        match record.holder.as_deref() {
            Some(holder) if holder == me => Action::Take { transition: false },
            None => Action::Take { transition: true },
            Some(holder) => {
                if now.duration_since(first_seen) >= record.lease_duration {
                    Action::Take { transition: true }
                } else {
                    Action::Follow {
                        holder: holder.to_string(),
                    }
                }
            }
        }
    }
}

fn now_micro() -> MicroTime {
    MicroTime(jiff_now())
}

fn jiff_now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}

fn spec_for(cfg: &LeaseConfig, previous: Option<&LeaseSpec>, transition: bool) -> LeaseSpec {
    let prev = previous.cloned().unwrap_or_default();
    let now = now_micro();
    LeaseSpec {
        holder_identity: Some(cfg.identity.clone()),
        lease_duration_seconds: Some(cfg.lease_duration.as_secs().max(1) as i32),
        acquire_time: if transition || prev.acquire_time.is_none() {
            Some(now.clone())
        } else {
            prev.acquire_time
        },
        renew_time: Some(now),
        lease_transitions: Some(prev.lease_transitions.unwrap_or(0) + i32::from(transition)),
        ..prev
    }
}

/// One round: read the Lease, decide, write if we lead. `Ok(true)` when we
/// hold the Lease after this round.
async fn round(api: &Api<Lease>, cfg: &LeaseConfig, elector: &mut Elector) -> kube::Result<bool> {
    let current = api.get_opt(&cfg.name).await?;
    let record = current.as_ref().map(Record::of);
    match elector.decide(&cfg.identity, record.as_ref(), Instant::now()) {
        Action::Create => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(cfg.name.clone()),
                    namespace: Some(cfg.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(spec_for(cfg, None, true)),
            };
            api.create(&PostParams::default(), &lease).await?;
            Ok(true)
        }
        Action::Take { transition } => {
            let mut lease = current.expect("Take comes only with a Lease");
            lease.spec = Some(spec_for(cfg, lease.spec.as_ref(), transition));
            // `metadata.resourceVersion` is kept: a concurrent writer makes
            // this a 409, and the other replica wins.
            api.replace(&cfg.name, &PostParams::default(), &lease).await?;
            Ok(true)
        }
        Action::Follow { .. } => Ok(false),
    }
}

/// Gives the Lease up at shutdown so another replica takes over at once
/// instead of after the TTL (client-go's `ReleaseOnCancel`).
pub async fn release(api: &Api<Lease>, cfg: &LeaseConfig) {
    let Ok(Some(mut lease)) = api.get_opt(&cfg.name).await else {
        return;
    };
    let Some(spec) = lease.spec.as_mut() else { return };
    if spec.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
        return;
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(now_micro());
    match api.replace(&cfg.name, &PostParams::default(), &lease).await {
        Ok(_) => tracing::info!(lease = %cfg.name, "released the leader Lease"),
        Err(e) => tracing::warn!(lease = %cfg.name, error = %e, "could not release the leader Lease"),
    }
}

/// [`run`] as a task of the current runtime (see
/// [`crate::source::cluster::spawn`] for why the library spawns it).
pub fn spawn(client: kube::Client, cfg: LeaseConfig, leading: watch::Sender<bool>) -> JoinHandle<()> {
    tokio::spawn(run(client, cfg, leading))
}

/// Runs the election until the process ends, publishing whether this
/// replica leads. A leader that cannot renew within the renew deadline
/// steps down before its Lease can expire for the others.
pub async fn run(client: kube::Client, cfg: LeaseConfig, leading: watch::Sender<bool>) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let mut elector = Elector::default();
    let mut last_renewal: Option<Instant> = None;
    loop {
        let result = round(&api, &cfg, &mut elector).await;
        let was = *leading.borrow();
        let now_leading = match result {
            Ok(true) => {
                last_renewal = Some(Instant::now());
                true
            }
            Ok(false) => false,
            Err(kube::Error::Api(status)) if status.code == 409 => false,
            Err(e) => {
                tracing::warn!(lease = %cfg.name, error = %e, "leader election round failed");
                // Keep leading only while the last renewal is recent enough.
                was && last_renewal.is_some_and(|t| t.elapsed() < cfg.renew_deadline)
            }
        };
        if now_leading != was {
            if now_leading {
                tracing::info!(identity = %cfg.identity, lease = %cfg.name, "became the leader");
            } else {
                tracing::warn!(identity = %cfg.identity, lease = %cfg.name, "stopped leading");
            }
            leading.send_replace(now_leading);
        }
        tokio::time::sleep(cfg.retry_period).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(holder: Option<&str>, renew: &str) -> Record {
        Record {
            holder: holder.map(str::to_string),
            lease_duration: Duration::from_secs(30),
            renew_time: Some(renew.into()),
            transitions: 0,
        }
    }

    #[test]
    fn no_lease_is_created_and_an_empty_holder_is_taken() {
        let mut e = Elector::default();
        let t0 = Instant::now();
        assert_eq!(e.decide("a", None, t0), Action::Create);
        assert_eq!(
            e.decide("a", Some(&record(None, "1")), t0),
            Action::Take { transition: true }
        );
    }

    #[test]
    fn the_holder_renews_without_a_transition() {
        let mut e = Elector::default();
        assert_eq!(
            e.decide("a", Some(&record(Some("a"), "1")), Instant::now()),
            Action::Take { transition: false }
        );
    }

    #[test]
    fn a_follower_waits_a_whole_lease_duration_of_its_own_clock() {
        let mut e = Elector::default();
        let t0 = Instant::now();
        let held = record(Some("b"), "1");
        let follow = Action::Follow { holder: "b".into() };
        assert_eq!(e.decide("a", Some(&held), t0), follow);
        assert_eq!(e.decide("a", Some(&held), t0 + Duration::from_secs(29)), follow);
        assert_eq!(
            e.decide("a", Some(&held), t0 + Duration::from_secs(30)),
            Action::Take { transition: true }
        );
    }

    #[test]
    fn a_renewal_restarts_the_followers_clock() {
        let mut e = Elector::default();
        let t0 = Instant::now();
        let follow = Action::Follow { holder: "b".into() };
        assert_eq!(e.decide("a", Some(&record(Some("b"), "1")), t0), follow);
        // The holder renewed at 20 s (a new renewTime): 25 s after t0 is
        // only 5 s after the renewal was seen.
        let renewed = record(Some("b"), "2");
        assert_eq!(e.decide("a", Some(&renewed), t0 + Duration::from_secs(20)), follow);
        assert_eq!(e.decide("a", Some(&renewed), t0 + Duration::from_secs(45)), follow);
        assert_eq!(
            e.decide("a", Some(&renewed), t0 + Duration::from_secs(50)),
            Action::Take { transition: true }
        );
    }

    #[test]
    fn ttl_derivation_follows_ingress_nginx() {
        let c = LeaseConfig::from_ttl("ns".into(), "id".into(), "me".into(), Duration::from_secs(30));
        assert_eq!(c.renew_deadline, Duration::from_secs(15));
        assert_eq!(c.retry_period, Duration::from_millis(7500));
    }

    #[test]
    fn a_new_holder_spec_counts_a_transition_and_keeps_other_fields() {
        let cfg = LeaseConfig::from_ttl("ns".into(), "id".into(), "me".into(), Duration::from_secs(4));
        let prev = LeaseSpec {
            holder_identity: Some("other".into()),
            lease_transitions: Some(3),
            ..Default::default()
        };
        let s = spec_for(&cfg, Some(&prev), true);
        assert_eq!(s.holder_identity.as_deref(), Some("me"));
        assert_eq!(s.lease_transitions, Some(4));
        assert_eq!(s.lease_duration_seconds, Some(4));
        let renewed = spec_for(&cfg, Some(&s), false);
        assert_eq!(renewed.lease_transitions, Some(4));
        assert_eq!(renewed.acquire_time, s.acquire_time);
    }
}
