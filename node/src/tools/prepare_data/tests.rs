//! `prepare-data`'s tests: a round trip per input kind, every bad input refused by name, runs
//! interrupted and repeated, `--index` over shards made elsewhere, and numpy reading the
//! shards back. Every input is written by the test; the tokenizer is the repository's
//! 4096-token BPE.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use parquet::data_type::{ByteArray, ByteArrayType, Int32Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use training::dataset::shard::{ShardWriter, TokenWidth};
use training::dataset::{Dataset, Manifest, Split};

use super::index::{index, IndexOptions};
use super::*;

pub(crate) fn tempdir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "iota-prepare-{tag}-{}-{}",
        std::process::id(),
        rand::random::<u64>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn tokenizer_path() -> PathBuf {
    repo().join("data/tokenizers/shakespeare-bpe-4096.json")
}

fn tokenizer() -> tokenizers::Tokenizer {
    tokenizers::Tokenizer::from_file(tokenizer_path()).unwrap()
}

const EOD: u32 = 0;

/// What the shards must hold for `docs`: each document's ids, then the end of document.
fn expected(docs: &[String]) -> Vec<Vec<u32>> {
    let tok = tokenizer();
    docs.iter()
        .map(|d| {
            let mut ids = tok
                .encode_fast(d.as_str(), false)
                .unwrap()
                .get_ids()
                .to_vec();
            ids.push(EOD);
            ids
        })
        .collect()
}

fn options(inputs: Vec<PathBuf>, out: &Path) -> Options {
    Options {
        tokenizer: tokenizer_path(),
        inputs,
        out: out.to_path_buf(),
        text_field: "text".into(),
        eod_token: None,
        shard_tokens: 100_000_000,
        val_tokens: None,
    }
}

/// Varied documents: ASCII, accents, CJK, emoji, newlines.
fn documents(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let mut d =
                format!("Document {i}: ROMEO. But soft, what light through yonder window breaks?");
            for _ in 0..(i % 5) {
                d.push_str(" Café, naïve — 日本語 🎭\nand again.");
            }
            d
        })
        .collect()
}

fn write_jsonl(path: &Path, docs: &[String]) {
    let mut text = String::new();
    for (i, d) in docs.iter().enumerate() {
        text.push_str(&serde_json::json!({ "id": i, "text": d }).to_string());
        text.push('\n');
    }
    std::fs::write(path, text).unwrap();
}

/// The ids of every shard of `split`, in manifest order, and their text bytes.
fn split_ids(out: &Path, m: &Manifest, split: Split) -> (Vec<u32>, u64) {
    let mut ids = Vec::new();
    let mut bytes = 0;
    for s in m.shards.iter().filter(|s| s.split == split) {
        let raw = std::fs::read(out.join(&s.name)).unwrap();
        assert_eq!(raw.len(), 1024 + s.tokens as usize * s.width as usize);
        ids.extend(
            raw[1024..]
                .chunks(s.width as usize)
                .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]]))),
        );
        bytes += s.text_bytes;
    }
    (ids, bytes)
}

/// Opens the dataset as a node would (every shard verified against the manifest).
fn open(out: &Path, summary: &Summary) -> Manifest {
    let d = Dataset::open(out, Some(summary.hash)).unwrap();
    for i in 0..d.manifest().shards.len() {
        assert!(d.has(i), "shard {i} verified and attached");
    }
    assert_eq!(
        std::fs::read(out.join("tokenizer.json")).unwrap(),
        std::fs::read(tokenizer_path()).unwrap()
    );
    assert_eq!(
        d.manifest().tokenizer.blake3,
        blake3::hash(&std::fs::read(tokenizer_path()).unwrap())
            .to_hex()
            .to_string()
    );
    d.manifest().clone()
}

#[test]
fn prepare_json_lines_round_trip_holds_out_every_hundredth_document() {
    let dir = tempdir("jsonl");
    let docs = documents(250);
    write_jsonl(&dir.join("docs.jsonl"), &docs);
    let out = dir.join("out");
    let mut opts = options(vec![dir.join("docs.jsonl")], &out);
    opts.shard_tokens = 700;
    let summary = prepare(&opts).unwrap();
    let m = open(&out, &summary);
    assert!(!out.join(STAGING_DIR).exists());
    assert_eq!(m.tokenizer.vocab_size, 4096);
    assert_eq!(m.tokenizer.eod_id, EOD);
    assert_eq!(summary.documents, 250);
    let want = expected(&docs);
    let held = [0usize, 100, 200];
    let (val, val_bytes) = split_ids(&out, &m, Split::Val);
    let (train, train_bytes) = split_ids(&out, &m, Split::Train);
    assert_eq!(
        val,
        held.iter()
            .flat_map(|&i| want[i].clone())
            .collect::<Vec<_>>()
    );
    let rest: Vec<u32> = (0..250)
        .filter(|i| !held.contains(i))
        .flat_map(|i| want[i].clone())
        .collect();
    assert_eq!(train, rest);
    // Text bytes are the documents' own, however the shards cut them.
    let bytes = |ks: &mut dyn Iterator<Item = usize>| ks.map(|k| docs[k].len() as u64).sum::<u64>();
    assert_eq!(val_bytes, bytes(&mut held.iter().copied()));
    assert_eq!(
        train_bytes,
        bytes(&mut (0..250).filter(|i| !held.contains(i)))
    );
    let train_shards: Vec<_> = m
        .shards
        .iter()
        .filter(|s| s.split == Split::Train)
        .collect();
    assert!(train_shards.len() > 3, "{} shards", train_shards.len());
    assert!(m.shards.iter().all(|s| s.tokens <= 700));
    assert!(train_shards[..train_shards.len() - 1]
        .iter()
        .all(|s| s.tokens == 700));
    assert_eq!(train_shards[0].name, "train_000000.bin");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn prepare_text_files_in_a_directory_are_read_in_name_order() {
    let dir = tempdir("txt");
    let corpus = dir.join("corpus");
    std::fs::create_dir_all(corpus.join("sub")).unwrap();
    std::fs::create_dir_all(corpus.join(".git")).unwrap();
    let docs: Vec<String> = documents(3).into_iter().map(|d| d + "\n").collect();
    std::fs::write(corpus.join("b.txt"), &docs[1]).unwrap();
    std::fs::write(corpus.join("a.txt"), &docs[0]).unwrap();
    std::fs::write(corpus.join("sub/c.txt"), &docs[2]).unwrap();
    std::fs::write(corpus.join("README.md"), "not read").unwrap();
    std::fs::write(corpus.join(".git/x.txt"), "not read").unwrap();
    let out = dir.join("out");
    let mut opts = options(vec![corpus], &out);
    opts.val_tokens = Some(5);
    let summary = prepare(&opts).unwrap();
    let m = open(&out, &summary);
    let stream: Vec<u32> = expected(&docs).concat();
    let (val, val_bytes) = split_ids(&out, &m, Split::Val);
    let (train, train_bytes) = split_ids(&out, &m, Split::Train);
    assert_eq!(val, stream[..5]);
    assert_eq!(train, stream[5..]);
    // The first document is cut after 5 tokens: its bytes are shared, none lost.
    assert!(val_bytes > 0 && val_bytes < docs[0].len() as u64);
    assert_eq!(
        val_bytes + train_bytes,
        docs.iter().map(|d| d.len() as u64).sum::<u64>()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Writes a Parquet file of `text` values (None: null) in row groups of `group` rows, with
/// an integer column beside them.
fn write_parquet(path: &Path, schema: &str, texts: &[Option<&str>], group: usize) {
    let schema = Arc::new(parquet::schema::parser::parse_message_type(schema).unwrap());
    let props = Arc::new(WriterProperties::builder().build());
    let file = std::fs::File::create(path).unwrap();
    let mut w = SerializedFileWriter::new(file, schema, props).unwrap();
    for (g, rows) in texts.chunks(group).enumerate() {
        let mut rg = w.next_row_group().unwrap();
        while let Some(mut col) = rg.next_column().unwrap() {
            let strings = matches!(
                col.untyped(),
                parquet::column::writer::ColumnWriter::ByteArrayColumnWriter(_)
            );
            match strings {
                true => {
                    let values: Vec<ByteArray> = rows
                        .iter()
                        .flatten()
                        .map(|t| ByteArray::from(t.as_bytes().to_vec()))
                        .collect();
                    let defs: Vec<i16> = rows.iter().map(|t| i16::from(t.is_some())).collect();
                    let w = col.typed::<ByteArrayType>();
                    let defs = (w.get_descriptor().max_def_level() > 0).then_some(defs);
                    w.write_batch(&values, defs.as_deref(), None).unwrap();
                }
                _ => {
                    let ids: Vec<i32> =
                        (0..rows.len() as i32).map(|i| i + g as i32 * 100).collect();
                    col.typed::<Int32Type>()
                        .write_batch(&ids, None, None)
                        .unwrap();
                }
            }
            col.close().unwrap();
        }
        rg.close().unwrap();
    }
    w.close().unwrap();
}

#[test]
fn prepare_parquet_round_trip_reads_every_row_group_and_skips_nulls() {
    let dir = tempdir("parquet");
    let docs = documents(7);
    let mut texts: Vec<Option<&str>> = docs.iter().map(|d| Some(d.as_str())).collect();
    texts.insert(3, None);
    let path = dir.join("fineweb.parquet");
    write_parquet(
        &path,
        "message m { REQUIRED INT32 id; OPTIONAL BYTE_ARRAY text (UTF8); }",
        &texts,
        3,
    );
    let out = dir.join("out");
    let mut opts = options(vec![path], &out);
    opts.val_tokens = Some(3);
    let summary = prepare(&opts).unwrap();
    assert_eq!(summary.documents, 7);
    let m = open(&out, &summary);
    let stream: Vec<u32> = expected(&docs).concat();
    let (val, _) = split_ids(&out, &m, Split::Val);
    let (train, _) = split_ids(&out, &m, Split::Train);
    assert_eq!([val, train].concat(), stream);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Runs `prepare` expecting an error mentioning every one of `needles`; nothing may be left
/// under a final name in `out`.
fn refused(opts: &Options, needles: &[&str]) {
    let err = prepare(opts).unwrap_err().to_string();
    for n in needles {
        assert!(err.contains(n), "{err:?} lacks {n:?}");
    }
    if opts.out.exists() {
        for entry in std::fs::read_dir(&opts.out).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            assert!(
                name == STAGING_DIR,
                "{name} left under a final name after {err}"
            );
        }
    }
}

#[test]
fn prepare_refuses_every_bad_input_naming_the_file_and_what_is_wrong() {
    let dir = tempdir("bad");
    let good = dir.join("good.jsonl");
    write_jsonl(&good, &documents(20));
    let cases: Vec<(&str, &[u8], Vec<&str>)> = vec![
        ("empty.txt", b"", vec!["empty.txt", "no text"]),
        ("blank.txt", b" \n\n\t", vec!["blank.txt", "no text"]),
        (
            "empty.jsonl",
            b"{\"text\": \"\"}\n\n{\"text\": \"  \"}\n",
            vec!["empty.jsonl", "no text", "\"text\""],
        ),
        (
            "broken.jsonl",
            b"{\"text\": \"fine\"}\n{\"text\": \"cut\n",
            vec!["broken.jsonl:2", "not JSON"],
        ),
        (
            "nofield.jsonl",
            b"{\"body\": \"fine\"}\n",
            vec!["nofield.jsonl:1", "no field \"text\""],
        ),
        (
            "number.jsonl",
            b"{\"text\": 5}\n",
            vec!["number.jsonl:1", "number, not a string"],
        ),
        (
            "array.jsonl",
            b"[\"text\"]\n",
            vec!["array.jsonl:1", "array, not an object"],
        ),
        (
            "latin1.txt",
            b"caf\xe9\n",
            vec!["latin1.txt", "not UTF-8", "byte 3"],
        ),
        (
            "junk.parquet",
            b"this is not parquet at all",
            vec!["junk.parquet", "Parquet"],
        ),
        (
            "notes.csv",
            b"a,b\n",
            vec!["notes.csv", "not a .txt, .jsonl or .parquet"],
        ),
    ];
    for (name, bytes, needles) in cases {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        // After a good file, so that shards were being written when the bad one came.
        refused(
            &options(vec![good.clone(), path], &dir.join(format!("out-{name}"))),
            &needles,
        );
    }

    let parquet_cases = [
        (
            "nocolumn.parquet",
            "message m { REQUIRED BYTE_ARRAY body (UTF8); }",
            vec!["nocolumn.parquet", "no column \"text\"", "body"],
        ),
        (
            "binary.parquet",
            "message m { REQUIRED BYTE_ARRAY text; }",
            vec![
                "binary.parquet",
                "column \"text\" is BYTE_ARRAY",
                "not a string",
            ],
        ),
        (
            "int.parquet",
            "message m { REQUIRED INT32 text; }",
            vec!["int.parquet", "column \"text\" is INT32", "not a string"],
        ),
    ];
    for (name, schema, needles) in parquet_cases {
        let path = dir.join(name);
        let texts = [Some("one"), Some("two")];
        write_parquet(&path, schema, &texts, 2);
        refused(
            &options(vec![good.clone(), path], &dir.join(format!("out-{name}"))),
            &needles,
        );
    }

    // Tokenizers: not one, one without an end-of-document token, an --eod-token it lacks.
    let junk = dir.join("junk.json");
    std::fs::write(&junk, b"{\"not\": \"a tokenizer\"}").unwrap();
    let mut opts = options(vec![good.clone()], &dir.join("out-tok"));
    opts.tokenizer = junk;
    refused(&opts, &["junk.json", "not a Hugging Face tokenizer.json"]);
    let no_eod = dir.join("no-eod.json");
    let json = std::fs::read_to_string(tokenizer_path()).unwrap();
    std::fs::write(&no_eod, json.replace("<|endoftext|>", "<|other|>")).unwrap();
    opts.tokenizer = no_eod.clone();
    refused(
        &opts,
        &["no-eod.json", "no end-of-document token", "--eod-token"],
    );
    opts.eod_token = Some("<|missing|>".into());
    refused(&opts, &["no-eod.json", "no token \"<|missing|>\""]);
    // ... which the right --eod-token fixes.
    opts.eod_token = Some("<|other|>".into());
    let summary = prepare(&opts).unwrap();
    assert_eq!(summary.manifest.tokenizer.eod_id, 0);

    // A single document cannot be split by documents.
    let one = dir.join("one.txt");
    std::fs::write(&one, "just one document").unwrap();
    refused(
        &options(vec![one], &dir.join("out-one")),
        &["1 document of", "no training tokens", "--val-tokens"],
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn prepare_interrupted_or_repeated_keeps_the_dataset_whole() {
    let dir = tempdir("rerun");
    let docs = documents(300);
    let input = dir.join("docs.jsonl");
    write_jsonl(&input, &docs);
    let out = dir.join("out");
    let mut opts = options(vec![input.clone()], &out);
    opts.shard_tokens = 500;
    let first = prepare(&opts).unwrap();
    let shards = first.manifest.shards.len();
    assert!(shards > 6);

    // A run that fails half way leaves the dataset there as it was.
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"text\": 1}\n").unwrap();
    let mut failing = opts.clone();
    failing.inputs.push(bad);
    failing.shard_tokens = 300;
    assert!(prepare(&failing).is_err());
    assert!(out.join(STAGING_DIR).exists());
    open(&out, &first);

    // Leftovers of an interrupted run: removed by the next one.
    std::fs::write(out.join("val_000000.bin.partial"), b"half").unwrap();
    std::fs::write(out.join("manifest.tmp"), b"half").unwrap();
    // Bigger shards: fewer of them, and the old extra ones are removed.
    opts.shard_tokens = 5_000;
    let second = prepare(&opts).unwrap();
    assert_ne!(second.hash, first.hash);
    open(&out, &second);
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let mut want: Vec<String> = second
        .manifest
        .shards
        .iter()
        .map(|s| s.name.clone())
        .collect();
    want.extend(["manifest.json".to_string(), "tokenizer.json".to_string()]);
    want.sort();
    assert_eq!(names, want);
    assert!(second.manifest.shards.len() < shards);

    // The same inputs again: the same dataset, byte for byte.
    let third = prepare(&opts).unwrap();
    assert_eq!(third.hash, second.hash);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Writes an llm.c-style shard: each document preceded by the end-of-document id.
fn llm_c_shard(path: &Path, docs: &[String]) -> u64 {
    let mut w = ShardWriter::create(path, TokenWidth::U16).unwrap();
    let tok = tokenizer();
    for d in docs {
        w.push(&[EOD]).unwrap();
        w.push(tok.encode_fast(d.as_str(), false).unwrap().get_ids())
            .unwrap();
    }
    w.finish().unwrap();
    docs.iter().map(|d| d.len() as u64).sum()
}

fn index_options(dir: &Path) -> IndexOptions {
    IndexOptions {
        tokenizer: tokenizer_path(),
        dir: dir.to_path_buf(),
        eod_token: None,
        val_shards: Vec::new(),
    }
}

#[test]
fn prepare_index_names_shards_made_elsewhere_without_rewriting_them() {
    let dir = tempdir("index");
    let docs = documents(40);
    let val_bytes = llm_c_shard(&dir.join("fineweb_val_000000.bin"), &docs[..5]);
    let train_bytes = llm_c_shard(&dir.join("fineweb_train_000001.bin"), &docs[5..25])
        + llm_c_shard(&dir.join("fineweb_train_000002.bin"), &docs[25..]);
    let before = std::fs::read(dir.join("fineweb_train_000001.bin")).unwrap();
    let summary = index(&index_options(&dir)).unwrap();
    let m = open(&dir, &summary);
    let names: Vec<(&str, Split)> = m
        .shards
        .iter()
        .map(|s| (s.name.as_str(), s.split))
        .collect();
    assert_eq!(
        names,
        [
            ("fineweb_train_000001.bin", Split::Train),
            ("fineweb_train_000002.bin", Split::Train),
            ("fineweb_val_000000.bin", Split::Val),
        ]
    );
    assert_eq!(m.split_totals(Split::Val).1, val_bytes);
    assert_eq!(m.split_totals(Split::Train).1, train_bytes);
    assert_eq!(
        std::fs::read(dir.join("fineweb_train_000001.bin")).unwrap(),
        before
    );

    // --val-shards overrides the naming convention.
    let mut opts = index_options(&dir);
    opts.val_shards = vec!["fineweb_train_000002.bin".into()];
    let m = index(&opts).unwrap().manifest;
    let val: Vec<&str> = m
        .shards
        .iter()
        .filter(|s| s.split == Split::Val)
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(val, ["fineweb_train_000002.bin"]);
    opts.val_shards = vec!["nope.bin".into()];
    let err = index(&opts).unwrap_err().to_string();
    assert!(err.contains("nope.bin"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn prepare_index_refuses_bad_shards_naming_the_file_and_what_is_wrong() {
    let dir = tempdir("index-bad");
    let docs = documents(10);
    llm_c_shard(&dir.join("a_val.bin"), &docs[..3]);
    llm_c_shard(&dir.join("b_train.bin"), &docs[3..]);
    let good = std::fs::read(dir.join("b_train.bin")).unwrap();
    let mut wrong_magic = good.clone();
    wrong_magic[0] ^= 1;
    let mut wrong_version = good.clone();
    wrong_version[4] = 7;
    let truncated = good[..good.len() - 2].to_vec();
    let mut out_of_vocab = good.clone();
    let at = 1024 + 2 * 5;
    out_of_vocab[at..at + 2].copy_from_slice(&4096u16.to_le_bytes());
    let cases: Vec<(Vec<u8>, Vec<&str>)> = vec![
        (wrong_magic, vec!["b_train.bin", "magic"]),
        (wrong_version, vec!["b_train.bin", "version 7"]),
        (truncated, vec!["b_train.bin", "truncated"]),
        (
            out_of_vocab,
            vec!["b_train.bin", "token 5 is 4096", "vocabulary of 4096"],
        ),
    ];
    for (bytes, needles) in cases {
        std::fs::write(dir.join("b_train.bin"), &bytes).unwrap();
        let err = index(&index_options(&dir)).unwrap_err().to_string();
        for n in needles {
            assert!(err.contains(n), "{err:?} lacks {n:?}");
        }
        assert!(!dir.join("manifest.json").exists());
    }
    // No held-out shard by name: say how to name one.
    std::fs::write(dir.join("b_train.bin"), &good).unwrap();
    std::fs::rename(dir.join("a_val.bin"), dir.join("a.bin")).unwrap();
    let err = index(&index_options(&dir)).unwrap_err().to_string();
    assert!(err.contains("--val-shards"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn prepare_shards_read_back_with_numpy_memmap_as_the_tokenizer_gives() {
    let python = repo().join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run ./scripts/setup.sh",
        python.display()
    );
    let dir = tempdir("numpy");
    let docs = documents(120);
    write_jsonl(&dir.join("docs.jsonl"), &docs);
    let out = dir.join("out");
    let summary = prepare(&options(vec![dir.join("docs.jsonl")], &out)).unwrap();
    let script = "import json, sys, numpy\n\
        m = json.load(open(sys.argv[1] + '/manifest.json'))\n\
        out = {}\n\
        for s in m['shards']:\n\
        \x20   p = sys.argv[1] + '/' + s['name']\n\
        \x20   h = numpy.fromfile(p, dtype=numpy.int32, count=3)\n\
        \x20   ids = numpy.memmap(p, dtype=numpy.uint16, mode='r', offset=1024)\n\
        \x20   out[s['name']] = {'header': h.tolist(), 'ids': ids.tolist()}\n\
        print(json.dumps(out))\n";
    let ran = Command::new(&python)
        .arg("-c")
        .arg(script)
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    let read: serde_json::Value = serde_json::from_slice(&ran.stdout).unwrap();
    let want = expected(&docs);
    let ids = |name: &str| -> Vec<u32> {
        let shard = &read[name];
        let ids: Vec<u32> = serde_json::from_value(shard["ids"].clone()).unwrap();
        let header: Vec<i64> = serde_json::from_value(shard["header"].clone()).unwrap();
        assert_eq!(header, [20_240_520, 1, ids.len() as i64]);
        ids
    };
    assert_eq!(
        ids("val_000000.bin"),
        [want[0].clone(), want[100].clone()].concat()
    );
    let train: Vec<u32> = (0..120)
        .filter(|i| i % 100 != 0)
        .flat_map(|i| want[i].clone())
        .collect();
    assert_eq!(ids("train_000000.bin"), train);
    assert_eq!(summary.manifest.shards.len(), 2);
    std::fs::remove_dir_all(&dir).unwrap();
}
