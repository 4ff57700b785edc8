//! The router's arm for requests: the budget first, then the serving service's rules, then
//! the service. A refused request is answered at once through the reporter and counted; an
//! accepted one is answered from a task of its own, because its answer awaits the service's
//! work (a forward through the stage, a merge partition, a validator's word) and the router
//! must not wait for that. Those tasks are bounded by the request budget: each holds its
//! slot until it has answered.

use p2p::{PeerId, RequestId};

use super::budget::BudgetSlot;
use super::Router;
use crate::rules::Refusal;
use crate::services::inbox::ServiceGone;
use crate::services::merge::api::MergeAnswer;
use crate::services::validator::api::{confirmation_request, spot_check_request};
use crate::wire::messages::{self, Service};
use crate::wire::rpc;

impl Router {
    /// Answers a refused request at once and counts it.
    async fn refuse(&self, id: RequestId, refusal: Refusal) {
        self.metrics.node.request_rejected(refusal.label());
        self.reporter.refuse(id, refusal.code()).await;
    }

    /// Checks a request against the rules; hands it to its service when it passes.
    pub(super) async fn on_request(
        &mut self,
        peer: PeerId,
        id: RequestId,
        data: Vec<u8>,
    ) -> Result<(), ServiceGone> {
        let Some(peer_str) = crate::wire::peer::try_of(&peer) else {
            // Not an id libp2p derives from a key: nobody a plan can name.
            self.refuse(id, Refusal::WrongStage).await;
            return Ok(());
        };
        let slot = match self.budget.acquire(&peer_str) {
            Ok(slot) => slot,
            Err(refusal) => {
                self.refuse(id, refusal).await;
                return Ok(());
            }
        };
        let Some(service) = Service::of(&data) else {
            // Not a pipeline tag: the merge service's, or nobody's.
            self.answer_merge(peer, id, data, slot);
            return Ok(());
        };
        if service == Service::Confirmation {
            self.on_confirmation(id, &data, slot).await;
            return Ok(());
        }
        if service == Service::Join {
            // What a joining node needs is for anyone: it checks every byte by hash.
            let reply = self.join_files.answer(&data);
            let _ = self.client.respond(id, reply).await;
            drop(slot);
            return Ok(());
        }
        if service == Service::Data {
            // The run's data is for anyone in it, under the same budget as every request.
            let data_service = self.services.data.clone();
            let client = self.client.clone();
            tokio::spawn(async move {
                let reply = data_service.answer(&data).await;
                let _ = client.respond(id, reply).await;
                drop(slot);
            });
            return Ok(());
        }
        let Some(miner) = self.services.miner.clone() else {
            self.refuse(id, Refusal::WrongStage).await;
            return Ok(());
        };
        // The miner has every plan a request may be judged under.
        self.hand_over_plan().await?;
        let book = &self.adopted;
        let checked = match service {
            Service::Forward => self.requests.forward(book, peer_str.as_str(), &data),
            Service::Eval => self.requests.eval(book, peer_str.as_str(), &data),
            Service::Weights => {
                let view = self.services.consensus.view.borrow();
                self.requests
                    .weights(book, &view.validators, peer_str.as_str(), &data)
            }
            Service::SpotCheck => {
                let view = self.services.consensus.view.borrow();
                spot_check_request(&view.validators, peer_str.as_str(), &data)
            }
            // Answered above.
            Service::Confirmation | Service::Data | Service::Join => Err(Refusal::FrameMalformed),
        };
        if let Err(refusal) = checked {
            tracing::debug!(%peer, reason = refusal.label(), "request refused");
            self.refuse(id, refusal).await;
            return Ok(());
        }
        let client = self.client.clone();
        tokio::spawn(async move {
            let reply = match miner.request(peer_str, service, data).await {
                Ok(reply) => reply,
                Err(_) => rpc::error_response(rpc::ErrorCode::Busy),
            };
            let _ = client.respond(id, reply).await;
            drop(slot);
        });
        Ok(())
    }

    /// A request of the merge service's (or nobody's), answered from a task.
    fn answer_merge(&self, peer: PeerId, id: RequestId, data: Vec<u8>, slot: BudgetSlot) {
        let client = self.client.clone();
        let merge = self.services.merge.clone();
        let metrics = self.metrics.node.clone();
        tokio::spawn(async move {
            let reply = match merge.request(peer, data.clone()).await {
                Ok(MergeAnswer::Reply(reply)) => reply,
                Ok(MergeAnswer::Refused(reason)) => {
                    metrics.request_rejected(reason);
                    rpc::error_response(rpc::ErrorCode::Refused)
                }
                Ok(MergeAnswer::NotMine) | Err(_) => rpc::fallback_response(&data),
            };
            let _ = client.respond(id, reply).await;
            drop(slot);
        });
    }

    /// A validator's word on a merge, to anyone who asks; a node that is not a validator
    /// refuses.
    async fn on_confirmation(&self, id: RequestId, data: &[u8], slot: BudgetSlot) {
        let request = match confirmation_request(self.services.validator.is_some(), data) {
            Ok(request) => request,
            Err(refusal) => return self.refuse(id, refusal).await,
        };
        let Some(validator) = self.services.validator.clone() else {
            return self.refuse(id, Refusal::NotServed).await;
        };
        let client = self.client.clone();
        tokio::spawn(async move {
            let reply = match validator.confirmation(request).await {
                Ok(answer) => messages::encode(Service::Confirmation, &answer, &[])
                    .unwrap_or_else(|_| rpc::error_response(rpc::ErrorCode::Busy)),
                Err(_) => rpc::error_response(rpc::ErrorCode::Busy),
            };
            let _ = client.respond(id, reply).await;
            drop(slot);
        });
    }
}
