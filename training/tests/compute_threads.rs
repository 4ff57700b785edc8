//! A process can wait for its compute threads to end before it exits (libtorch's teardown
//! at exit must not run under a thread still computing). In a file of its own: the count is
//! the whole process's, which other tests' threads would change.

// Helpers outside #[test] functions unwrap too: in a test, a panic is a failure report.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use training::wire::{Codec, WireDtype};
use training::worker::{wait_for_compute_threads, StageHandle, WorkerConfig};
use training::{Preset, StageConfig};

#[tokio::test]
async fn the_wait_ends_when_the_last_dropped_handles_thread_has_ended() {
    assert!(wait_for_compute_threads(Duration::ZERO), "no thread yet");
    let stage = StageConfig::new(Preset::Tiny, 2, 0, 16, 5);
    let (handle, thread) =
        StageHandle::spawn(WorkerConfig::new(stage, Codec::new(WireDtype::Bf16), 1))
            .await
            .unwrap();
    assert!(
        !wait_for_compute_threads(Duration::from_millis(50)),
        "a thread whose handle is held is still running"
    );
    drop(handle);
    assert!(
        wait_for_compute_threads(Duration::from_secs(30)),
        "the thread ends once its handle is dropped"
    );
    thread.join().unwrap();
}
