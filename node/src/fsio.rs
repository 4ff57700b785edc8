//! Files written whole or not at all: the one helper every writer of state under a data dir
//! uses (plans, weights, the node key), so a crash never leaves a half-written file under its
//! final name; and the one reader of the text files a user points a flag at (`--run`,
//! `--metagraph`, `--model-config`), refused past a size bound before they are read.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Writes `bytes` to `path` through a temporary file beside it (extension `tmp`), synced, then
/// renamed over `path`. `private` makes the file readable by its owner only (unix).
pub(crate) fn write_atomically(path: &Path, bytes: &[u8], private: bool) -> std::io::Result<()> {
    let tmp = temporary(path);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = private;
    let mut file = options.open(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Reads a text file, refusing one larger than `limit` bytes before reading it.
pub(crate) fn read_limited(path: &Path, limit: u64) -> std::io::Result<String> {
    let len = std::fs::metadata(path)?.len();
    if len > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("file of {len} bytes is larger than the limit of {limit}"),
        ));
    }
    std::fs::read_to_string(path)
}

/// The temporary name `path` is written under (its extension replaced by `tmp`).
fn temporary(path: &Path) -> PathBuf {
    path.with_extension("tmp")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_replaced_whole_and_no_temporary_is_left() {
        let dir = std::env::temp_dir().join(format!("iota-fsio-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("plan.json");
        write_atomically(&path, b"first", false).unwrap();
        write_atomically(&path, b"second", true).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        assert!(!temporary(&path).exists());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
