//! Phase 3, every member: take each partition's agreed claim from either holder, or settle
//! a dispute by recomputing the claims from the committed inputs, and assemble the merged
//! vector.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::task::JoinSet;

use super::{MergeOutcome, MergeReport, Runner};
use crate::butterfly::fetch::{specs_for, Fetched, Fetcher, InputSpec, Traffic};
use crate::butterfly::ledger::{resolve, Check, Decision};
use crate::butterfly::{
    Evidence, Hash, MemberId, MisbehaviourKind, Plan, Request, SliceHash, Transport,
};

/// What one partition's task came back with.
#[derive(Debug, Default)]
struct Taken {
    partition: usize,
    /// The values taken and the included set they average; `None`: keep local.
    values: Option<(Vec<f32>, Vec<MemberId>)>,
    traffic: Traffic,
    mismatches: u64,
    /// Holders whose claim did not reproduce, with the evidence.
    wrong: Vec<(usize, Evidence)>,
    /// Members (or holders) whose served bytes differ from what they committed or claimed.
    served_mismatch: Vec<(usize, Evidence)>,
    unreachable: Vec<usize>,
}

impl<T: Transport> Runner<T> {
    /// Runs phase 3 until every partition is taken or `done_by`, and builds the outcome.
    pub(super) async fn collect(mut self) -> MergeOutcome {
        let deadline = self.cfg.timing.done_by;
        let fetcher = self.fetcher(deadline);
        let partitions = self.plan().partitions();
        let mut taken: Vec<Option<(Vec<f32>, Vec<MemberId>)>> = vec![None; partitions];
        let mut tasks: JoinSet<Taken> = JoinSet::new();
        for (p, slot) in taken.iter_mut().enumerate() {
            match self.ledger.decide(p, Some(self.me)) {
                Decision::KeepLocal => {
                    tracing::warn!(partition = p, "no usable claim, keeping local values");
                }
                Decision::Accept { claim, sources } => {
                    if sources.first() == Some(&self.me) {
                        if let Some(values) = self.server.averaged(p as u32, &claim.result) {
                            *slot = Some((values.to_vec(), claim.included));
                            continue;
                        }
                    }
                    let sources: Vec<(usize, String)> = sources
                        .into_iter()
                        .filter(|&s| s != self.me)
                        .map(|s| (s, self.plan().member(s).to_string()))
                        .collect();
                    let len = self.plan().range(p).len();
                    tasks.spawn(fetch_agreed(fetcher.clone(), claim, sources, len));
                }
                Decision::Dispute { claims } => {
                    self.mismatches += 1;
                    tracing::warn!(partition = p, "holders disagree, recomputing");
                    let specs = claims
                        .iter()
                        .map(|c| specs_for(&self.ledger, self.plan(), c))
                        .collect();
                    let cache = self
                        .held
                        .get(&p)
                        .map(|h| h.inputs.clone())
                        .unwrap_or_default();
                    let plan = Arc::clone(&self.cfg.plan);
                    let holders = claims
                        .iter()
                        .map(|c| plan.index_of(&c.holder))
                        .collect::<Option<Vec<_>>>()
                        .unwrap_or_default();
                    let job = DisputeJob {
                        plan,
                        partition: p,
                        claims,
                        holders,
                        specs,
                        cache,
                    };
                    tasks.spawn(settle_dispute(fetcher.clone(), job));
                }
            }
        }
        while !tasks.is_empty() {
            tokio::select! {
                Some(joined) = tasks.join_next() => match joined {
                    Ok(result) => {
                        let p = result.partition;
                        taken[p] = self.absorb(result).await;
                    }
                    Err(error) => tracing::error!(%error, "partition task failed"),
                },
                received = self.transport.next_gossip(), if self.gossip_open => {
                    self.on_gossip(received).await;
                }
                _ = tokio::time::sleep_until(deadline) => {
                    tracing::warn!(left = tasks.len(), "done deadline passed");
                    break;
                }
            }
        }
        self.assemble(taken)
    }

    /// Books a partition task's findings and returns what it took.
    async fn absorb(&mut self, taken: Taken) -> Option<(Vec<f32>, Vec<MemberId>)> {
        self.traffic.add(taken.traffic);
        self.mismatches += taken.mismatches;
        self.unreachable.extend(taken.unreachable);
        for (holder, evidence) in taken.wrong {
            let report = self
                .ledger
                .report(holder, MisbehaviourKind::WrongAverage, evidence);
            self.report(report).await;
        }
        for (member, evidence) in taken.served_mismatch {
            self.ledger.exclude(member);
            let report = self
                .ledger
                .report(member, MisbehaviourKind::Equivocation, evidence);
            self.report(report).await;
        }
        taken.values
    }

    fn assemble(self, taken: Vec<Option<(Vec<f32>, Vec<MemberId>)>>) -> MergeOutcome {
        let plan = Arc::clone(&self.cfg.plan);
        let mut values = self.values.to_vec();
        let mut included = Vec::with_capacity(taken.len());
        let mut kept_local = Vec::new();
        for (p, t) in taken.into_iter().enumerate() {
            match t {
                Some((v, members)) => {
                    values[plan.range(p)].copy_from_slice(&v);
                    included.push(members);
                }
                None => {
                    kept_local.push(p as u32);
                    included.push(Vec::new());
                }
            }
        }
        let served = self.server.served();
        let report = MergeReport {
            bytes_sent: self.traffic.sent + served.responses_out,
            bytes_received: self.traffic.received + served.requests_in,
            mismatches: self.mismatches,
            misbehaviour: self.misbehaviour,
            partitions_kept_local: kept_local,
            included,
            unreachable: self
                .unreachable
                .iter()
                .map(|&m| plan.member(m).to_string())
                .collect(),
            invalid_messages: self.invalid_messages,
            weights_capped: self.ledger.capped(),
            result_hash: Hash::of_values(&values),
        };
        tracing::info!(
            bytes_sent = report.bytes_sent,
            bytes_received = report.bytes_received,
            mismatches = report.mismatches,
            kept_local = report.partitions_kept_local.len(),
            result = %report.result_hash,
            "merge done"
        );
        MergeOutcome { values, report }
    }
}

/// Fetches the agreed average from the first source that serves bytes with its hash.
async fn fetch_agreed<T: Transport>(
    fetcher: Fetcher<T>,
    claim: SliceHash,
    sources: Vec<(usize, String)>,
    len: usize,
) -> Taken {
    let p = claim.partition as usize;
    let mut out = Taken {
        partition: p,
        ..Taken::default()
    };
    for (holder, id) in sources {
        let request = Request::Averaged {
            epoch: fetcher.epoch,
            stage: fetcher.stage,
            partition: claim.partition,
            result: claim.result,
        };
        let (fetched, traffic) = fetcher.fetch(&id, request, len, claim.result).await;
        out.traffic.add(traffic);
        match fetched {
            Fetched::Values(values) => {
                out.values = Some((values, claim.included));
                return out;
            }
            Fetched::Mismatch(served) => {
                out.mismatches += 1;
                out.served_mismatch.push((
                    holder,
                    Evidence::ServedMismatch {
                        partition: claim.partition,
                        committed: claim.result,
                        served,
                    },
                ));
            }
            Fetched::NonFinite | Fetched::Failed => out.unreachable.push(holder),
        }
    }
    tracing::warn!(partition = p, "no holder served the agreed average");
    out
}

/// A disputed partition to settle.
struct DisputeJob {
    plan: Arc<Plan>,
    partition: usize,
    /// The conflicting claims.
    claims: Vec<SliceHash>,
    /// Each claim's holder (member index).
    holders: Vec<usize>,
    /// Each claim's inputs, `None` where a commitment is unknown.
    specs: Vec<Option<Vec<InputSpec>>>,
    /// Inputs already verified (a holder's own fetches).
    cache: BTreeMap<usize, Arc<[f32]>>,
}

/// Recomputes each disputed claim and takes the one [`resolve`] picks.
async fn settle_dispute<T: Transport>(fetcher: Fetcher<T>, job: DisputeJob) -> Taken {
    let DisputeJob {
        plan,
        partition: p,
        claims,
        holders,
        specs,
        cache,
    } = job;
    let (checked, effects) = fetcher.check_claims(plan, p, &claims, specs, cache).await;
    let mut out = Taken {
        partition: p,
        traffic: effects.traffic,
        mismatches: effects.served_mismatch.len() as u64,
        unreachable: effects.unreachable,
        ..Taken::default()
    };
    out.served_mismatch = effects
        .served_mismatch
        .into_iter()
        .map(|(member, committed, served)| {
            let evidence = Evidence::ServedMismatch {
                partition: p as u32,
                committed,
                served,
            };
            (member, evidence)
        })
        .collect();
    let verdicts: Vec<(SliceHash, Check)> = claims
        .iter()
        .cloned()
        .zip(checked.iter().map(|c| c.check))
        .collect();
    let (chosen, wrong) = resolve(&verdicts);
    for i in wrong {
        if let (Check::Refuted(recomputed), Some(&holder)) = (verdicts[i].1, holders.get(i)) {
            out.wrong.push((
                holder,
                Evidence::WrongAverage {
                    partition: p as u32,
                    round: claims[i].round,
                    claimed: claims[i].result,
                    recomputed,
                },
            ));
        }
    }
    let mut checked = checked;
    out.values = chosen.and_then(|i| {
        let values = checked[i].values.take()?;
        Some((values, claims[i].included.clone()))
    });
    out
}
