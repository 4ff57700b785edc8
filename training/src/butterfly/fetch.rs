//! Checked fetches over a [`Transport`]: a peer's bytes are only ever returned when their
//! hash is the one expected, and recomputing a claim uses only inputs that match the
//! members' commitments.
//!
//! Every request takes a permit from a shared semaphore (bounding concurrent requests per
//! node), waits at most the fetch timeout and never past the phase deadline, and counts its
//! encoded bytes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::ledger::{Check, Ledger};
use super::{
    robust, weighted_average, Contribution, Hash, Plan, Request, Response, SliceHash, Transport,
};

/// Bytes a piece of the protocol put on and took off the wire.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Traffic {
    pub(crate) sent: u64,
    pub(crate) received: u64,
}

impl Traffic {
    pub(crate) fn add(&mut self, other: Traffic) {
        self.sent += other.sent;
        self.received += other.received;
    }
}

/// What a checked fetch got.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Fetched {
    /// Bytes with the expected hash and length.
    Values(Vec<f32>),
    /// Bytes arrived but hash to this instead (or have the wrong length).
    Mismatch(Hash),
    /// The committed bytes arrived, but hold a NaN or an infinity.
    NonFinite,
    /// No usable answer (unreachable, timeout, refusal).
    Failed,
}

/// Everything a fetch needs, cheap to clone into tasks.
pub(crate) struct Fetcher<T> {
    pub(crate) transport: Arc<T>,
    pub(crate) permits: Arc<Semaphore>,
    pub(crate) epoch: u64,
    pub(crate) stage: u32,
    pub(crate) timeout: Duration,
    pub(crate) deadline: Instant,
}

impl<T> Clone for Fetcher<T> {
    fn clone(&self) -> Self {
        Fetcher {
            transport: Arc::clone(&self.transport),
            permits: Arc::clone(&self.permits),
            epoch: self.epoch,
            stage: self.stage,
            timeout: self.timeout,
            deadline: self.deadline,
        }
    }
}

/// One input of a recomputation: who, with what weight, expected to hash to what.
#[derive(Debug, Clone)]
pub(crate) struct InputSpec {
    pub(crate) index: usize,
    pub(crate) member: String,
    pub(crate) samples: u64,
    pub(crate) hash: Hash,
}

/// Result of checking one claim by recomputation.
#[derive(Debug)]
pub(crate) struct Checked {
    pub(crate) check: Check,
    /// The recomputed average when it reproduced the claim.
    pub(crate) values: Option<Vec<f32>>,
}

/// Findings of [`Fetcher::check_claims`] besides the verdicts.
#[derive(Debug, Default)]
pub(crate) struct CheckSideEffects {
    pub(crate) traffic: Traffic,
    /// Members that served bytes differing from their commitment: (member, committed, served).
    pub(crate) served_mismatch: Vec<(usize, Hash, Hash)>,
    /// Members whose input could not be fetched.
    pub(crate) unreachable: Vec<usize>,
    /// Members whose input matched their commitment but held a NaN or an infinity:
    /// (member, committed hash). They are also in `unreachable` (nothing to average).
    pub(crate) non_finite: Vec<(usize, Hash)>,
    /// Every input fetched and verified (with those given in the cache).
    pub(crate) inputs: BTreeMap<usize, Arc<[f32]>>,
}

impl<T: Transport> Fetcher<T> {
    /// Asks `peer` for `request`, expecting `len` values hashing to `expected`.
    pub(crate) async fn fetch(
        &self,
        peer: &str,
        request: Request,
        len: usize,
        expected: Hash,
    ) -> (Fetched, Traffic) {
        let mut traffic = Traffic::default();
        let Some(timeout) = self.timeout_now() else {
            return (Fetched::Failed, traffic);
        };
        let Ok(_permit) = self.permits.acquire().await else {
            return (Fetched::Failed, traffic);
        };
        traffic.sent += request.encoded_len() as u64;
        let response = self.transport.request(peer, request, timeout).await;
        let fetched = match response {
            Ok(response) => {
                traffic.received += response.encoded_len() as u64;
                match response {
                    Response::Values(values) => {
                        let hash = Hash::of_values(&values);
                        if hash == expected && values.len() == len {
                            if values.iter().all(|v| v.is_finite()) {
                                Fetched::Values(values)
                            } else {
                                Fetched::NonFinite
                            }
                        } else {
                            Fetched::Mismatch(hash)
                        }
                    }
                    Response::Unavailable(reason) => {
                        tracing::debug!(peer, ?reason, "peer could not serve");
                        Fetched::Failed
                    }
                }
            }
            Err(error) => {
                tracing::debug!(peer, %error, "fetch failed");
                Fetched::Failed
            }
        };
        (fetched, traffic)
    }

    /// A member's committed input of `partition`.
    pub(crate) async fn input(
        &self,
        plan: &Plan,
        spec: &InputSpec,
        partition: usize,
    ) -> (Fetched, Traffic) {
        let request = Request::Input {
            epoch: self.epoch,
            stage: self.stage,
            partition: partition as u32,
        };
        self.fetch(
            &spec.member,
            request,
            plan.range(partition).len(),
            spec.hash,
        )
        .await
    }

    fn timeout_now(&self) -> Option<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        (!left.is_zero()).then(|| left.min(self.timeout))
    }

    /// Recomputes each claim of `partition` from the committed inputs (fetched
    /// concurrently, reusing `cache`, which holds inputs already verified) and says whether
    /// it reproduces. `specs[i]` describes claim i's included members, `None` when some
    /// included member's commitment is unknown (the claim then cannot be checked).
    pub(crate) async fn check_claims(
        &self,
        plan: Arc<Plan>,
        partition: usize,
        claims: &[SliceHash],
        specs: Vec<Option<Vec<InputSpec>>>,
        mut cache: BTreeMap<usize, Arc<[f32]>>,
    ) -> (Vec<Checked>, CheckSideEffects) {
        let mut effects = CheckSideEffects::default();
        // Fetch every input any checkable claim needs, once.
        let mut wanted: BTreeMap<usize, InputSpec> = BTreeMap::new();
        for spec in specs.iter().flatten().flatten() {
            if !cache.contains_key(&spec.index) {
                wanted.insert(spec.index, spec.clone());
            }
        }
        let mut tasks = JoinSet::new();
        for spec in wanted.into_values() {
            let fetcher = self.clone();
            let plan = Arc::clone(&plan);
            tasks.spawn(async move {
                let (fetched, traffic) = fetcher.input(&plan, &spec, partition).await;
                (spec, fetched, traffic)
            });
        }
        while let Some(joined) = tasks.join_next().await {
            let Ok((spec, fetched, traffic)) = joined else {
                continue;
            };
            effects.traffic.add(traffic);
            match fetched {
                Fetched::Values(values) => {
                    cache.insert(spec.index, values.into());
                }
                Fetched::Mismatch(served) => effects
                    .served_mismatch
                    .push((spec.index, spec.hash, served)),
                Fetched::NonFinite => {
                    effects.non_finite.push((spec.index, spec.hash));
                    effects.unreachable.push(spec.index);
                }
                Fetched::Failed => effects.unreachable.push(spec.index),
            }
        }
        let checked = claims
            .iter()
            .zip(specs)
            .map(|(claim, spec)| match spec {
                None => Checked {
                    check: Check::Unknown,
                    values: None,
                },
                Some(spec) => recheck(claim, &spec, &cache),
            })
            .collect();
        effects.inputs = cache;
        (checked, effects)
    }
}

/// Averages the cached inputs of `spec` and compares with the claim.
fn recheck(claim: &SliceHash, spec: &[InputSpec], cache: &BTreeMap<usize, Arc<[f32]>>) -> Checked {
    let unknown = Checked {
        check: Check::Unknown,
        values: None,
    };
    let mut contributions = Vec::with_capacity(spec.len());
    for s in spec {
        let Some(values) = cache.get(&s.index) else {
            return unknown;
        };
        contributions.push(Contribution {
            member: &s.member,
            samples: s.samples,
            values,
        });
    }
    let Ok(average) = weighted_average(&contributions) else {
        return unknown;
    };
    let hash = Hash::of_values(&average);
    if hash != claim.result {
        Checked {
            check: Check::Refuted(hash),
            values: None,
        }
    } else if !robust::outliers(&contributions).is_empty() {
        Checked {
            check: Check::AdmitsOutlier,
            values: None,
        }
    } else {
        Checked {
            check: Check::Reproduced,
            values: Some(average),
        }
    }
}

/// The inputs of `claim` as the ledger's commitments describe them, or `None` when a
/// commitment is missing.
pub(crate) fn specs_for(ledger: &Ledger, plan: &Plan, claim: &SliceHash) -> Option<Vec<InputSpec>> {
    let p = claim.partition as usize;
    claim
        .included
        .iter()
        .map(|m| {
            let index = plan.index_of(m)?;
            let c = ledger.commitment(index)?;
            Some(InputSpec {
                index,
                member: m.clone(),
                samples: c.samples,
                hash: c.partition_hashes[p],
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three members' inputs of one partition: two honest replicas close together, and the
    /// third ten times the first (a `poison-merge` member).
    fn inputs() -> (Vec<InputSpec>, BTreeMap<usize, Arc<[f32]>>) {
        let values: [Vec<f32>; 3] = [
            vec![1.0, 2.0, 3.0, 4.0],
            vec![1.1, 2.1, 2.9, 4.2],
            vec![10.0, 20.0, 30.0, 40.0],
        ];
        let mut specs = Vec::new();
        let mut cache = BTreeMap::new();
        for (index, (member, v)) in ["a", "b", "c"].iter().zip(values).enumerate() {
            specs.push(InputSpec {
                index,
                member: (*member).to_owned(),
                samples: 10,
                hash: Hash::of_values(&v),
            });
            cache.insert(index, Arc::from(v));
        }
        (specs, cache)
    }

    /// A claim averaging `spec`'s members to a result hashing to `result`.
    fn claim(spec: &[InputSpec], result: Hash) -> SliceHash {
        SliceHash {
            epoch: 1,
            stage: 0,
            partition: 0,
            round: 0,
            holder: "a".into(),
            included: spec.iter().map(|s| s.member.clone()).collect(),
            input_hashes: spec.iter().map(|s| s.hash).collect(),
            result,
        }
    }

    /// The true average of `spec`'s cached inputs.
    fn average_of(spec: &[InputSpec], cache: &BTreeMap<usize, Arc<[f32]>>) -> Vec<f32> {
        let contributions: Vec<Contribution<'_>> = spec
            .iter()
            .map(|s| Contribution {
                member: &s.member,
                samples: s.samples,
                values: &cache[&s.index],
            })
            .collect();
        weighted_average(&contributions).unwrap()
    }

    #[test]
    fn a_claim_that_averages_in_an_outlier_is_not_taken_even_when_its_arithmetic_holds() {
        let (specs, cache) = inputs();
        let with_poison = average_of(&specs, &cache);
        let checked = recheck(
            &claim(&specs, Hash::of_values(&with_poison)),
            &specs,
            &cache,
        );
        assert_eq!(checked.check, Check::AdmitsOutlier);
        assert!(
            checked.values.is_none(),
            "an admitted outlier's average is not used"
        );
    }

    #[test]
    fn a_claim_without_the_outlier_is_reproduced_and_a_wrong_one_refuted() {
        let (specs, cache) = inputs();
        let honest = &specs[..2];
        let average = average_of(honest, &cache);
        let checked = recheck(&claim(honest, Hash::of_values(&average)), honest, &cache);
        assert_eq!(checked.check, Check::Reproduced);
        assert_eq!(checked.values.as_deref(), Some(&average[..]));

        let wrong: Vec<f32> = average.iter().map(|v| v + 1.0).collect();
        let checked = recheck(&claim(honest, Hash::of_values(&wrong)), honest, &cache);
        assert_eq!(checked.check, Check::Refuted(Hash::of_values(&average)));
    }

    #[test]
    fn a_claim_whose_input_was_not_fetched_has_no_verdict() {
        let (specs, mut cache) = inputs();
        let average = average_of(&specs[..2], &cache);
        cache.remove(&1);
        let checked = recheck(
            &claim(&specs[..2], Hash::of_values(&average)),
            &specs[..2],
            &cache,
        );
        assert_eq!(checked.check, Check::Unknown);
    }
}
