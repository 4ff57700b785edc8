//! The documents `prepare-data` reads: which files (directories walked recursively, in name
//! order, so that the same inputs always give the same dataset), and the documents in each.
//!
//! - `.txt`: the whole file is one document (UTF-8).
//! - `.jsonl`: one JSON object per line; the document is its `--text-field` string. Blank
//!   lines are skipped; a line that is not JSON, not an object, lacks the field or whose
//!   field is not a string is refused, naming the file and line.
//! - `.parquet`: the `--text-field` column, which must be a top-level, non-repeated
//!   `BYTE_ARRAY` annotated as a string (`String`/`UTF8`), as in Hugging Face's Parquet
//!   exports (FineWeb). It is read with the parquet crate's column reader, row group by row
//!   group and a thousand values at a time, so memory stays within a page or two of the
//!   column whatever the file's size. Null values are skipped.
//!
//! Empty documents (nothing but whitespace) are skipped; a file with no text at all is
//! refused, since it is almost always the wrong file or the wrong field. A file named on the command line with another
//! extension is refused; inside a directory such a file (a `README.md`, a `.gitattributes`)
//! is skipped and counted, and hidden files and directories (`.git`) are not walked.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use parquet::basic::{ConvertedType, LogicalType, Type as PhysicalType};
use parquet::column::reader::ColumnReader;
use parquet::data_type::ByteArray;
use parquet::file::reader::{FileReader, SerializedFileReader};

/// Values read from a Parquet column at a time.
const PARQUET_BATCH: usize = 1024;

/// What a file holds, by its extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `.txt`: one document.
    Text,
    /// `.jsonl`: a document per line.
    JsonLines,
    /// `.parquet`: a document per row.
    Parquet,
}

impl Kind {
    /// The kind of a file by its extension (case-insensitive).
    pub(crate) fn of(path: &Path) -> Option<Kind> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "txt" => Some(Kind::Text),
            "jsonl" => Some(Kind::JsonLines),
            "parquet" => Some(Kind::Parquet),
            _ => None,
        }
    }
}

/// One input file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Input {
    /// Where it is.
    pub(crate) path: PathBuf,
    /// What it holds.
    pub(crate) kind: Kind,
    /// Its size on disk.
    pub(crate) bytes: u64,
}

/// The files found for the paths given.
#[derive(Debug, Default)]
pub(crate) struct Found {
    /// The inputs, in the order they are read.
    pub(crate) inputs: Vec<Input>,
    /// Files inside directories skipped for their extension.
    pub(crate) skipped: Vec<PathBuf>,
}

/// Why an input was refused; every variant names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum InputError {
    /// The file or directory could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file named on the command line is none of the kinds read.
    #[error("{}: not a .txt, .jsonl or .parquet file", path.display())]
    Extension {
        /// The file.
        path: PathBuf,
    },
    /// A directory holds no file of a kind read.
    #[error("{}: no .txt, .jsonl or .parquet file in this directory", path.display())]
    EmptyDirectory {
        /// The directory.
        path: PathBuf,
    },
    /// The file holds no text.
    #[error("{}: no text in this file{}", path.display(), hint)]
    NoText {
        /// The file.
        path: PathBuf,
        /// What to check.
        hint: String,
    },
    /// A text file is not UTF-8.
    #[error("{}: not UTF-8 text (at byte {offset})", path.display())]
    NotUtf8 {
        /// The file.
        path: PathBuf,
        /// Where the first invalid byte is.
        offset: usize,
    },
    /// A JSON line is not JSON.
    #[error("{}:{line}: not JSON: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: u64,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// A JSON line lacks the text field or it is not a string.
    #[error("{}:{line}: {what}", path.display())]
    Field {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: u64,
        /// What is wrong.
        what: String,
    },
    /// The Parquet file could not be read.
    #[error("{}: Parquet: {source}", path.display())]
    Parquet {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: parquet::errors::ParquetError,
    },
    /// The Parquet file has no such top-level column.
    #[error("{}: no column {field:?} (columns: {columns})", path.display())]
    MissingColumn {
        /// The file.
        path: PathBuf,
        /// The column looked for.
        field: String,
        /// The columns it has.
        columns: String,
    },
    /// The Parquet column is not a string column.
    #[error("{}: column {field:?} is {got}, not a string (BYTE_ARRAY annotated String/UTF8)", path.display())]
    NotAString {
        /// The file.
        path: PathBuf,
        /// The column.
        field: String,
        /// What it is.
        got: String,
    },
    /// A Parquet value is not UTF-8.
    #[error("{}: row group {row_group}, value {index}: not UTF-8", path.display())]
    ParquetNotUtf8 {
        /// The file.
        path: PathBuf,
        /// The row group.
        row_group: usize,
        /// The value's position in the row group.
        index: u64,
    },
}

/// The inputs `paths` name: files as given, directories walked recursively in name order.
pub(crate) fn find(paths: &[PathBuf]) -> Result<Found, InputError> {
    let mut found = Found::default();
    for path in paths {
        let meta = std::fs::metadata(path).map_err(|source| InputError::Io {
            path: path.clone(),
            source,
        })?;
        if meta.is_dir() {
            let before = found.inputs.len();
            walk(path, &mut found)?;
            if found.inputs.len() == before {
                return Err(InputError::EmptyDirectory { path: path.clone() });
            }
        } else {
            let kind =
                Kind::of(path).ok_or_else(|| InputError::Extension { path: path.clone() })?;
            found.inputs.push(Input {
                path: path.clone(),
                kind,
                bytes: meta.len(),
            });
        }
    }
    Ok(found)
}

fn walk(dir: &Path, found: &mut Found) -> Result<(), InputError> {
    let io = |source| InputError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut entries = std::fs::read_dir(dir)
        .map_err(io)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(io)?;
    entries.sort();
    for path in entries {
        let hidden = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with('.'));
        if hidden {
            continue;
        }
        let meta = std::fs::metadata(&path).map_err(|source| InputError::Io {
            path: path.clone(),
            source,
        })?;
        if meta.is_dir() {
            walk(&path, found)?;
        } else if let Some(kind) = Kind::of(&path) {
            found.inputs.push(Input {
                path,
                kind,
                bytes: meta.len(),
            });
        } else {
            found.skipped.push(path);
        }
    }
    Ok(())
}

/// Reads `input`'s documents in order, handing each non-empty one to `emit`; `emit` returns
/// false to stop early. `consumed` grows by the file's bytes as they are read (for progress).
/// Returns the documents handed over; a file with none is an error.
pub(crate) fn read(
    input: &Input,
    text_field: &str,
    consumed: &AtomicU64,
    emit: &mut dyn FnMut(String) -> bool,
) -> Result<u64, InputError> {
    let mut docs = 0u64;
    let mut stopped = false;
    let mut take = |text: String| {
        if stopped || text.trim().is_empty() {
            return;
        }
        docs += 1;
        stopped = !emit(text);
    };
    let hint = match input.kind {
        Kind::Text => {
            read_text(input, consumed, &mut take)?;
            String::new()
        }
        Kind::JsonLines => {
            read_json_lines(input, text_field, consumed, &mut take)?;
            format!(" (field {text_field:?} empty on every line)")
        }
        Kind::Parquet => {
            read_parquet(input, text_field, consumed, &mut take)?;
            format!(" (column {text_field:?} empty or null in every row)")
        }
    };
    if docs == 0 {
        return Err(InputError::NoText {
            path: input.path.clone(),
            hint,
        });
    }
    Ok(docs)
}

fn read_text(
    input: &Input,
    consumed: &AtomicU64,
    take: &mut dyn FnMut(String),
) -> Result<(), InputError> {
    let path = &input.path;
    let io = |source| InputError::Io {
        path: path.clone(),
        source,
    };
    let mut bytes = Vec::new();
    File::open(path)
        .map_err(io)?
        .read_to_end(&mut bytes)
        .map_err(io)?;
    consumed.fetch_add(bytes.len() as u64, Ordering::Relaxed);
    let text = String::from_utf8(bytes).map_err(|e| InputError::NotUtf8 {
        path: path.clone(),
        offset: e.utf8_error().valid_up_to(),
    })?;
    take(text);
    Ok(())
}

fn read_json_lines(
    input: &Input,
    field: &str,
    consumed: &AtomicU64,
    take: &mut dyn FnMut(String),
) -> Result<(), InputError> {
    let path = &input.path;
    let io = |source| InputError::Io {
        path: path.clone(),
        source,
    };
    let mut reader = BufReader::with_capacity(1 << 20, File::open(path).map_err(io)?);
    let mut line = Vec::new();
    let mut number = 0u64;
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line).map_err(io)?;
        if n == 0 {
            return Ok(());
        }
        number += 1;
        consumed.fetch_add(n as u64, Ordering::Relaxed);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let value: serde_json::Value =
            serde_json::from_slice(&line).map_err(|source| InputError::Json {
                path: path.clone(),
                line: number,
                source,
            })?;
        let bad = |what: String| InputError::Field {
            path: path.clone(),
            line: number,
            what,
        };
        let serde_json::Value::Object(mut object) = value else {
            return Err(bad(format!("a JSON {}, not an object", json_kind(&value))));
        };
        match object.remove(field) {
            Some(serde_json::Value::String(text)) => take(text),
            Some(other) => {
                return Err(bad(format!(
                    "field {field:?} is a JSON {}, not a string",
                    json_kind(&other)
                )))
            }
            None => return Err(bad(format!("no field {field:?} (see --text-field)"))),
        }
    }
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "object",
    }
}

fn read_parquet(
    input: &Input,
    field: &str,
    consumed: &AtomicU64,
    take: &mut dyn FnMut(String),
) -> Result<(), InputError> {
    let path = &input.path;
    let pq = |source| InputError::Parquet {
        path: path.clone(),
        source,
    };
    let file = File::open(path).map_err(|source| InputError::Io {
        path: path.clone(),
        source,
    })?;
    let reader = SerializedFileReader::new(file).map_err(pq)?;
    let column = string_column(path, &reader, field)?;
    for g in 0..reader.num_row_groups() {
        let group = reader.get_row_group(g).map_err(pq)?;
        let size = u64::try_from(group.metadata().compressed_size()).unwrap_or(0);
        let ColumnReader::ByteArrayColumnReader(mut values_reader) =
            group.get_column_reader(column).map_err(pq)?
        else {
            // string_column checked the physical type.
            return Err(InputError::NotAString {
                path: path.clone(),
                field: field.to_string(),
                got: "not a BYTE_ARRAY".into(),
            });
        };
        let mut values: Vec<ByteArray> = Vec::with_capacity(PARQUET_BATCH);
        let mut levels: Vec<i16> = Vec::with_capacity(PARQUET_BATCH);
        let mut index = 0u64;
        loop {
            values.clear();
            levels.clear();
            let (records, _, _) = values_reader
                .read_records(PARQUET_BATCH, Some(&mut levels), None, &mut values)
                .map_err(pq)?;
            if records == 0 {
                break;
            }
            for value in values.drain(..) {
                let text = String::from_utf8(value.data().to_vec()).map_err(|_| {
                    InputError::ParquetNotUtf8 {
                        path: path.clone(),
                        row_group: g,
                        index,
                    }
                })?;
                index += 1;
                take(text);
            }
        }
        consumed.fetch_add(size, Ordering::Relaxed);
    }
    Ok(())
}

/// The leaf index of the top-level string column `field`.
fn string_column(
    path: &Path,
    reader: &SerializedFileReader<File>,
    field: &str,
) -> Result<usize, InputError> {
    let schema = reader.metadata().file_metadata().schema_descr();
    let columns = schema.columns();
    let Some(index) = columns
        .iter()
        .position(|c| c.path().parts().len() == 1 && c.path().parts()[0] == field)
    else {
        let names: Vec<String> = columns.iter().map(|c| c.path().string()).collect();
        return Err(InputError::MissingColumn {
            path: path.to_path_buf(),
            field: field.to_string(),
            columns: names.join(", "),
        });
    };
    let c = &columns[index];
    let string = c.physical_type() == PhysicalType::BYTE_ARRAY
        && (matches!(c.logical_type_ref(), Some(LogicalType::String))
            || c.converted_type() == ConvertedType::UTF8);
    if !string || c.max_rep_level() > 0 {
        let annotation = match (c.logical_type_ref(), c.converted_type()) {
            (Some(l), _) => format!(" ({l:?})"),
            (None, ConvertedType::NONE) => String::new(),
            (None, t) => format!(" ({t})"),
        };
        let repeated = if c.max_rep_level() > 0 {
            "a repeated "
        } else {
            ""
        };
        return Err(InputError::NotAString {
            path: path.to_path_buf(),
            field: field.to_string(),
            got: format!("{repeated}{}{annotation}", c.physical_type()),
        });
    }
    Ok(index)
}
