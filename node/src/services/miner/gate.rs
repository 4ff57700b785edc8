//! Which epoch's samples a miner serves: those of the epoch whose plan and stage it has in
//! place. A forward of an epoch this miner is still entering (merging the epoch before,
//! loading its stage) waits for it, within the sample's own time, and is then routed by the
//! new plan; one of an epoch that is over here is refused, since its gradient would land on
//! weights merged since.

use std::time::Duration;

use tokio::sync::watch;

/// The newest epoch this miner has entered, and a way to wait for the next.
pub(crate) struct EpochGate {
    entered: watch::Sender<Option<u64>>,
}

/// Why a sample of an epoch is not served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    /// This miner is already in a later epoch.
    #[error("epoch {epoch} is over here (this miner is in epoch {here})")]
    Over {
        /// The sample's epoch.
        epoch: u64,
        /// The epoch this miner is in.
        here: u64,
    },
    /// This miner did not enter the sample's epoch within the sample's time.
    #[error("this miner has not entered epoch {epoch} yet")]
    NotYet {
        /// The sample's epoch.
        epoch: u64,
    },
}

impl EpochGate {
    /// A gate before any epoch.
    pub(crate) fn new() -> EpochGate {
        EpochGate {
            entered: watch::channel(None).0,
        }
    }

    /// This miner has `epoch`'s plan and stage in place (never goes back).
    pub(crate) fn enter(&self, epoch: u64) {
        self.entered.send_if_modified(|e| {
            if e.is_none_or(|e| e < epoch) {
                *e = Some(epoch);
                true
            } else {
                false
            }
        });
    }

    /// Waits, at most `patience`, until this miner is in `epoch`.
    pub(crate) async fn admit(&self, epoch: u64, patience: Duration) -> Result<(), Refused> {
        let mut rx = self.entered.subscribe();
        let wait = async {
            loop {
                let here = *rx.borrow_and_update();
                match here {
                    Some(here) if here == epoch => return Ok(()),
                    Some(here) if here > epoch => return Err(Refused::Over { epoch, here }),
                    _ => {}
                }
                if rx.changed().await.is_err() {
                    return Err(Refused::NotYet { epoch });
                }
            }
        };
        tokio::time::timeout(patience, wait)
            .await
            .unwrap_or(Err(Refused::NotYet { epoch }))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::{EpochGate, Refused};

    const PATIENCE: Duration = Duration::from_secs(5);

    /// A sample of `epoch` admitted on a task of its own, seen waiting (paused time only
    /// advances once every task is idle).
    async fn waiting_for(
        gate: &Arc<EpochGate>,
        epoch: u64,
    ) -> tokio::task::JoinHandle<Result<(), Refused>> {
        let waiting = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.admit(epoch, PATIENCE).await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiting.is_finished(), "it waits for epoch {epoch}");
        waiting
    }

    #[tokio::test(start_paused = true)]
    async fn a_sample_of_the_epoch_in_force_passes_at_once() {
        let gate = EpochGate::new();
        gate.enter(3);
        assert_eq!(gate.admit(3, Duration::ZERO).await, Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_sample_of_an_epoch_being_entered_waits_for_it() {
        let gate = Arc::new(EpochGate::new());
        gate.enter(3);
        let waiting = waiting_for(&gate, 4).await;
        gate.enter(4);
        assert_eq!(waiting.await.unwrap(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_ends_with_the_samples_time() {
        let gate = EpochGate::new();
        assert_eq!(
            gate.admit(0, PATIENCE).await,
            Err(Refused::NotYet { epoch: 0 })
        );
        gate.enter(0);
        assert_eq!(
            gate.admit(1, PATIENCE).await,
            Err(Refused::NotYet { epoch: 1 })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_sample_of_an_epoch_that_is_over_is_refused() {
        let gate = Arc::new(EpochGate::new());
        gate.enter(5);
        gate.enter(4); // never goes back
        assert_eq!(
            gate.admit(4, PATIENCE).await,
            Err(Refused::Over { epoch: 4, here: 5 })
        );
        // A waiting sample whose epoch is skipped over is refused when the miner moves on.
        let waiting = waiting_for(&gate, 6).await;
        gate.enter(7);
        assert_eq!(
            waiting.await.unwrap(),
            Err(Refused::Over { epoch: 6, here: 7 })
        );
    }
}
