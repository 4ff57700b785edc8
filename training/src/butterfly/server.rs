//! The serving side of a merge: answers peers' requests for this member's inputs and for
//! the averages it holds.
//!
//! A [`Server`] is a cheap handle (an `Arc`) shared by the protocol, which stores each
//! average it computes, and the network layer, which calls [`Server::handle`] for every
//! inbound request. It keeps serving after the merge returns (auditors fetch inputs late)
//! until the node drops it. Guarantees: it only ever serves this member's own values or an
//! average under the exact result hash it was stored with; it keeps at most
//! [`KEPT_ROUNDS`] averages per partition; its byte counters count what it was asked and
//! what it answered.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::{Hash, Plan, Request, Response, Unavailable};

/// Averages kept per held partition; older rounds are dropped first.
pub const KEPT_ROUNDS: usize = 4;

/// Byte counters of a [`Server`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServedBytes {
    /// Encoded bytes of the requests it answered.
    pub requests_in: u64,
    /// Encoded bytes of its responses.
    pub responses_out: u64,
}

/// Answers merge requests for one member in one merge. Clone freely.
#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
}

type Versions = Vec<(Hash, Arc<[f32]>)>;

struct Inner {
    epoch: u64,
    stage: u32,
    plan: Arc<Plan>,
    me: usize,
    values: Arc<[f32]>,
    /// Per partition, the averages computed so far, oldest first.
    averaged: Mutex<Vec<Versions>>,
    requests_in: AtomicU64,
    responses_out: AtomicU64,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("epoch", &self.inner.epoch)
            .field("stage", &self.inner.stage)
            .field("member", &self.inner.plan.member(self.inner.me))
            .finish_non_exhaustive()
    }
}

impl Server {
    /// A server for member `me` (an index into `plan`) serving `values` (the full vector).
    pub(crate) fn new(
        epoch: u64,
        stage: u32,
        plan: Arc<Plan>,
        me: usize,
        values: Arc<[f32]>,
    ) -> Self {
        let partitions = plan.partitions();
        Server {
            inner: Arc::new(Inner {
                epoch,
                stage,
                plan,
                me,
                values,
                averaged: Mutex::new(vec![Vec::new(); partitions]),
                requests_in: AtomicU64::new(0),
                responses_out: AtomicU64::new(0),
            }),
        }
    }

    /// The answer to `request`, counted in [`Server::served`]. Copies the partition (at
    /// most [`MAX_PARTITION_VALUES`](super::MAX_PARTITION_VALUES) values when the plan's
    /// partitions respect it); call from a blocking-tolerant context for large partitions.
    pub fn handle(&self, request: &Request) -> Response {
        let response = self.answer(request);
        self.inner
            .requests_in
            .fetch_add(request.encoded_len() as u64, Ordering::Relaxed);
        self.inner
            .responses_out
            .fetch_add(response.encoded_len() as u64, Ordering::Relaxed);
        response
    }

    fn answer(&self, request: &Request) -> Response {
        let inner = &self.inner;
        let (epoch, stage, partition) = match request {
            Request::Input {
                epoch,
                stage,
                partition,
            }
            | Request::Averaged {
                epoch,
                stage,
                partition,
                ..
            } => (*epoch, *stage, *partition as usize),
        };
        if (epoch, stage) != (inner.epoch, inner.stage) {
            return Response::Unavailable(Unavailable::WrongMerge);
        }
        if partition >= inner.plan.partitions() {
            return Response::Unavailable(Unavailable::NoSuchPartition);
        }
        match request {
            Request::Input { .. } => {
                Response::Values(inner.values[inner.plan.range(partition)].to_vec())
            }
            Request::Averaged { result, .. } => {
                if !inner.plan.is_holder(partition, inner.me) {
                    return Response::Unavailable(Unavailable::NotHolder);
                }
                match self.averaged(partition as u32, result) {
                    Some(values) => Response::Values(values.to_vec()),
                    None => Response::Unavailable(Unavailable::UnknownResult),
                }
            }
        }
    }

    /// The average of `partition` stored under `result`, if this server has it.
    pub fn averaged(&self, partition: u32, result: &Hash) -> Option<Arc<[f32]>> {
        let averaged = self
            .inner
            .averaged
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        averaged
            .get(partition as usize)?
            .iter()
            .find(|(h, _)| h == result)
            .map(|(_, v)| Arc::clone(v))
    }

    /// Byte counters so far.
    pub fn served(&self) -> ServedBytes {
        ServedBytes {
            requests_in: self.inner.requests_in.load(Ordering::Relaxed),
            responses_out: self.inner.responses_out.load(Ordering::Relaxed),
        }
    }

    /// Makes an average servable under its hash, dropping the oldest beyond [`KEPT_ROUNDS`].
    pub(crate) fn store_averaged(&self, partition: usize, result: Hash, values: Arc<[f32]>) {
        let mut averaged = self
            .inner
            .averaged
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let versions = &mut averaged[partition];
        if versions.iter().any(|(h, _)| *h == result) {
            return;
        }
        if versions.len() == KEPT_ROUNDS {
            versions.remove(0);
        }
        versions.push((result, values));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::butterfly::plan;

    fn server() -> (Server, Arc<Plan>, usize) {
        let members: Vec<String> = (0..4).map(|i| format!("m{i}")).collect();
        let plan = Arc::new(plan(5, &members, 4, 10).unwrap());
        let me = plan.holders(0)[0];
        let values: Arc<[f32]> = (0..10).map(|i| i as f32).collect();
        (Server::new(3, 1, Arc::clone(&plan), me, values), plan, me)
    }

    #[test]
    fn serves_inputs_and_only_stored_averages_of_held_partitions() {
        let (server, plan, me) = server();
        let input = Request::Input {
            epoch: 3,
            stage: 1,
            partition: 1,
        };
        let expected: Vec<f32> = plan.range(1).map(|i| i as f32).collect();
        assert_eq!(server.handle(&input), Response::Values(expected));
        let avg = [0.5f32, 0.25, 1.0];
        let hash = Hash::of_values(&avg[..plan.range(0).len()]);
        let ask = Request::Averaged {
            epoch: 3,
            stage: 1,
            partition: 0,
            result: hash,
        };
        assert_eq!(
            server.handle(&ask),
            Response::Unavailable(Unavailable::UnknownResult)
        );
        server.store_averaged(0, hash, avg[..plan.range(0).len()].into());
        assert_eq!(
            server.handle(&ask),
            Response::Values(avg[..plan.range(0).len()].to_vec())
        );
        let not_held = (0..4).find(|&p| !plan.is_holder(p, me)).unwrap();
        let ask = Request::Averaged {
            epoch: 3,
            stage: 1,
            partition: not_held as u32,
            result: hash,
        };
        assert_eq!(
            server.handle(&ask),
            Response::Unavailable(Unavailable::NotHolder)
        );
        let wrong = Request::Input {
            epoch: 4,
            stage: 1,
            partition: 0,
        };
        assert_eq!(
            server.handle(&wrong),
            Response::Unavailable(Unavailable::WrongMerge)
        );
        let out = Request::Input {
            epoch: 3,
            stage: 1,
            partition: 9,
        };
        assert_eq!(
            server.handle(&out),
            Response::Unavailable(Unavailable::NoSuchPartition)
        );
        assert!(server.served().responses_out > 0 && server.served().requests_in > 0);
    }

    #[test]
    fn keeps_a_bounded_number_of_rounds() {
        let (server, _, _) = server();
        let hashes: Vec<Hash> = (0..KEPT_ROUNDS + 1).map(|i| Hash([i as u8; 32])).collect();
        for h in &hashes {
            server.store_averaged(0, *h, vec![1.0].into());
        }
        assert!(server.averaged(0, &hashes[0]).is_none());
        assert!(hashes[1..].iter().all(|h| server.averaged(0, h).is_some()));
    }
}
