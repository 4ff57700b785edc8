//! Where Bittensor keeps hotkey files: `<wallet_path>/<wallet_name>/hotkeys/<hotkey_name>`.

use std::path::{Component, Path, PathBuf};

/// Default wallet directory of `btcli` and bittensor-wallet (`~` is the home directory).
pub const DEFAULT_WALLET_PATH: &str = "~/.bittensor/wallets";
/// Default wallet (coldkey) name.
pub const DEFAULT_WALLET_NAME: &str = "default";
/// Default hotkey name.
pub const DEFAULT_HOTKEY_NAME: &str = "default";

/// Why a wallet location does not name a hotkey file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WalletPathError {
    /// The wallet path is empty.
    #[error("the wallet path is empty")]
    EmptyWalletPath,
    /// The wallet path starts with `~user`, which is not expanded.
    #[error("the wallet path starts with `~user`; only `~` (the home directory) is expanded")]
    OtherUsersHome,
    /// A wallet or hotkey name is empty, `.`, `..`, or contains a path separator or NUL.
    #[error("{what} name {name:?} is not a plain file name")]
    BadName {
        /// `"wallet"` or `"hotkey"`.
        what: &'static str,
        /// The name given (at most 64 characters of it).
        name: String,
    },
}

/// The hotkey file of a wallet, resolved the Bittensor way.
///
/// `None` takes the default ([`DEFAULT_WALLET_PATH`], [`DEFAULT_WALLET_NAME`],
/// [`DEFAULT_HOTKEY_NAME`]). A leading `~` of the wallet path is `home`; a relative wallet
/// path stays relative (to the caller's working directory). Pure: nothing is read.
pub fn hotkey_file_path(
    home: &Path,
    wallet_path: Option<&Path>,
    wallet_name: Option<&str>,
    hotkey_name: Option<&str>,
) -> Result<PathBuf, WalletPathError> {
    let wallet_path = wallet_path.unwrap_or(Path::new(DEFAULT_WALLET_PATH));
    let wallet_name = wallet_name.unwrap_or(DEFAULT_WALLET_NAME);
    let hotkey_name = hotkey_name.unwrap_or(DEFAULT_HOTKEY_NAME);
    check_name("wallet", wallet_name)?;
    check_name("hotkey", hotkey_name)?;
    let base = expand_home(home, wallet_path)?;
    Ok(base.join(wallet_name).join("hotkeys").join(hotkey_name))
}

/// Replaces a leading `~` component with `home`.
fn expand_home(home: &Path, path: &Path) -> Result<PathBuf, WalletPathError> {
    let mut components = path.components();
    match components.next() {
        None => Err(WalletPathError::EmptyWalletPath),
        Some(Component::Normal(first)) if first == "~" => Ok(home.join(components.as_path())),
        Some(Component::Normal(first)) if first.as_encoded_bytes().starts_with(b"~") => {
            Err(WalletPathError::OtherUsersHome)
        }
        Some(_) => Ok(path.to_owned()),
    }
}

/// A wallet or hotkey name must be one plain path component.
fn check_name(what: &'static str, name: &str) -> Result<(), WalletPathError> {
    let plain =
        !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0']);
    if plain {
        Ok(())
    } else {
        Err(WalletPathError::BadName {
            what,
            name: name.chars().take(64).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOME: &str = "/home/alice";

    #[test]
    fn defaults_are_bittensors() {
        assert_eq!(
            hotkey_file_path(Path::new(HOME), None, None, None).unwrap(),
            PathBuf::from("/home/alice/.bittensor/wallets/default/hotkeys/default")
        );
    }

    #[test]
    fn explicit_parts_and_tilde_expansion() {
        let path = hotkey_file_path(
            Path::new(HOME),
            Some(Path::new("~/w")),
            Some("cold"),
            Some("hot1"),
        );
        assert_eq!(
            path.unwrap(),
            PathBuf::from("/home/alice/w/cold/hotkeys/hot1")
        );
        let path = hotkey_file_path(Path::new(HOME), Some(Path::new("/srv/w/")), None, None);
        assert_eq!(
            path.unwrap(),
            PathBuf::from("/srv/w/default/hotkeys/default")
        );
        let path = hotkey_file_path(Path::new(HOME), Some(Path::new("~")), None, Some("h"));
        assert_eq!(
            path.unwrap(),
            PathBuf::from("/home/alice/default/hotkeys/h")
        );
        let path = hotkey_file_path(Path::new(HOME), Some(Path::new("rel/w")), None, None);
        assert_eq!(
            path.unwrap(),
            PathBuf::from("rel/w/default/hotkeys/default")
        );
    }

    #[test]
    fn rejects_bad_names_and_paths() {
        let home = Path::new(HOME);
        for bad in ["", ".", "..", "a/b", "a\\b", "a\0b"] {
            assert!(matches!(
                hotkey_file_path(home, None, Some(bad), None),
                Err(WalletPathError::BadName { what: "wallet", .. })
            ));
            assert!(matches!(
                hotkey_file_path(home, None, None, Some(bad)),
                Err(WalletPathError::BadName { what: "hotkey", .. })
            ));
        }
        assert_eq!(
            hotkey_file_path(home, Some(Path::new("")), None, None),
            Err(WalletPathError::EmptyWalletPath)
        );
        assert_eq!(
            hotkey_file_path(home, Some(Path::new("~bob/w")), None, None),
            Err(WalletPathError::OtherUsersHome)
        );
    }
}
