//! Checkpoints round-trip bit-exactly, survive corruption by falling back, and do not grow
//! the data directory.

// Helpers outside #[test] functions unwrap too: in a test, a panic is a failure report.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::{Path, PathBuf};

use training::checkpoint::{CheckpointKey, CheckpointStore};
use training::{Corpus, Preset, Stage, StageConfig, StageState};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("iota-ckpt-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    dir
}

fn dir_size(p: &Path) -> u64 {
    fs::read_dir(p)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() {
                dir_size(&e.path())
            } else {
                m.len()
            }
        })
        .sum()
}

fn trained_stage() -> Stage {
    tch::set_num_threads(1);
    let mut s = Stage::new(&StageConfig::new(Preset::Tiny, 1, 0, 0, 4)).unwrap();
    let corpus = Corpus::shakespeare().unwrap();
    for i in 0..2 {
        let b = corpus.train_sample(i, 4, 2, 16).unwrap();
        s.forward_loss(&b.inputs_tensor(), &b.targets_tensor())
            .unwrap();
        s.step().unwrap();
    }
    s
}

fn key(step: u64) -> CheckpointKey {
    CheckpointKey {
        run: 1,
        stage: 0,
        epoch: step / 10,
        step,
    }
}

#[test]
fn a_checkpoint_restores_the_stage_bit_exactly() {
    let dir = temp_dir("round-trip");
    let mut stage = trained_stage();
    let state = stage.export_state();
    {
        let store = CheckpointStore::open(&dir).unwrap();
        let m = store.save(&key(2), &state).unwrap();
        assert_eq!(m.step, 2);
        assert_eq!(
            m.bytes as usize,
            fs::read(store.blob_path(&m)).unwrap().len()
        );
    }
    // Reopened, as a restarted node would.
    let store = CheckpointStore::open(&dir).unwrap();
    let (m, loaded) = store.load_latest(1, 0).unwrap().unwrap();
    assert_eq!((m.run, m.stage, m.epoch, m.step), (1, 0, 0, 2));
    assert_eq!(loaded, state);
    let mut fresh = Stage::new(&StageConfig::new(Preset::Tiny, 1, 0, 0, 99)).unwrap();
    fresh.import_state(&loaded).unwrap();
    assert_eq!(fresh.weights_hash(), stage.weights_hash());
    // And it continues identically.
    let b = Corpus::shakespeare()
        .unwrap()
        .train_sample(7, 4, 2, 16)
        .unwrap();
    for s in [&mut stage, &mut fresh] {
        s.forward_loss(&b.inputs_tensor(), &b.targets_tensor())
            .unwrap();
        s.step().unwrap();
    }
    assert_eq!(fresh.weights_hash(), stage.weights_hash());
    assert!(
        store.load_latest(2, 0).unwrap().is_none(),
        "other runs are separate"
    );
    fs::remove_dir_all(&dir).unwrap();
}

fn variant(base: &StageState, i: usize) -> StageState {
    let mut s = base.clone();
    s.step = i as u64;
    s.params[0] = i as f32;
    s
}

#[test]
fn a_corrupted_checkpoint_falls_back_to_the_previous_good_one() {
    let dir = temp_dir("corrupt");
    let base = trained_stage().export_state();
    let store = CheckpointStore::open(&dir).unwrap();
    for i in 1..=3 {
        store.save(&key(i), &variant(&base, i as usize)).unwrap();
    }
    let newest = store.list(1, 0).unwrap().pop().unwrap();
    assert_eq!(newest.step, 3);
    // Flip one bit in the newest blob.
    let path = store.blob_path(&newest);
    let mut bytes = fs::read(&path).unwrap();
    bytes[1000] ^= 0x10;
    fs::write(&path, &bytes).unwrap();
    let (m, s) = store.load_latest(1, 0).unwrap().unwrap();
    assert_eq!((m.step, s.params[0]), (2, 2.0));
    // Truncate the next one too, and delete nothing else: the oldest is still good.
    let second = store.blob_path(&m);
    let len = fs::metadata(&second).unwrap().len();
    fs::File::options()
        .write(true)
        .open(&second)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let (m, s) = store.load_latest(1, 0).unwrap().unwrap();
    assert_eq!((m.step, s), (1, variant(&base, 1)));
    fs::remove_file(store.blob_path(&m)).unwrap();
    assert!(store.load_latest(1, 0).unwrap().is_none());
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_hundred_saves_keep_the_directory_small() {
    let dir = temp_dir("hundred");
    let base = trained_stage().export_state();
    let store = CheckpointStore::open(&dir).unwrap();
    let one = store.save(&key(0), &base).unwrap().bytes;
    assert!(one > 10_000_000, "a ~10 MB stage, got {one} bytes");
    let started = std::time::Instant::now();
    let mut largest = 0;
    for i in 1..=100 {
        store.save(&key(i), &variant(&base, i as usize)).unwrap();
        largest = largest.max(dir_size(&dir));
    }
    let end = dir_size(&dir);
    eprintln!(
        "100 saves of {one} bytes in {:.1} s; data dir {end} bytes at the end, {largest} at most",
        started.elapsed().as_secs_f64()
    );
    assert!(
        largest < 5 * one,
        "data dir grew to {largest} bytes (one checkpoint: {one})"
    );
    let kept = store.list(1, 0).unwrap();
    assert_eq!(
        kept.iter().map(|m| m.step).collect::<Vec<_>>(),
        vec![98, 99, 100]
    );
    assert_eq!(fs::read_dir(dir.join("blobs")).unwrap().count(), 3);
    let (m, s) = store.load_latest(1, 0).unwrap().unwrap();
    assert_eq!((m.step, s), (100, variant(&base, 100)));
    fs::remove_dir_all(&dir).unwrap();
}
