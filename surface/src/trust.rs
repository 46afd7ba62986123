//! The bot's end-to-end-encryption identity: cross-signing (so its device shows as verified by
//! its owner), server-side key backup and recovery (so a new state directory reads old
//! encrypted messages). Set up on first start; restored from `MATRIX_RECOVERY_KEY` when the
//! account already has it and this device does not.

use std::io::Write;

use matrix_sdk::Client;
use matrix_sdk::encryption::recovery::RecoveryState;
use matrix_sdk::encryption::{BackupDownloadStrategy, EncryptionSettings};
use matrix_sdk::ruma::api::client::uiaa;
use tracing::{error, info, warn};

use crate::config::Config;

/// What the client does on its own: download room keys from the backup when a message cannot
/// be decrypted. Cross-signing and the backup itself are set up by [`ensure`].
pub fn settings() -> EncryptionSettings {
    EncryptionSettings {
        auto_enable_cross_signing: false,
        auto_enable_backups: false,
        backup_download_strategy: BackupDownloadStrategy::AfterDecryptionFailure,
    }
}

/// What [`ensure`] has to do, from the account's recovery state (pure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Cross-signing, backup and recovery are in place on this device.
    Nothing,
    /// The account has none: create the identity and the backup, protected by the configured
    /// passphrase or by a new recovery key shown once.
    Bootstrap,
    /// The account has them but this device lacks the secrets: recover with the key.
    Recover,
    /// The account has them, this device lacks the secrets, and no key is configured.
    NeedKey,
    /// The state could not be read (homeserver unreachable); try at the next start.
    Unknown,
}

/// Decides the step (pure).
pub fn step(state: RecoveryState, have_key: bool) -> Step {
    match (state, have_key) {
        (RecoveryState::Enabled, _) => Step::Nothing,
        (RecoveryState::Disabled, _) => Step::Bootstrap,
        (RecoveryState::Incomplete, true) => Step::Recover,
        (RecoveryState::Incomplete, false) => Step::NeedKey,
        (RecoveryState::Unknown, _) => Step::Unknown,
    }
}

/// Sets up or restores the bot's identity and key backup. Failures are logged, never fatal:
/// the bot still answers, only without backup and with an unverified device.
pub async fn ensure(client: &Client, config: &Config) {
    let encryption = client.encryption();
    encryption.wait_for_e2ee_initialization_tasks().await;
    let recovery = encryption.recovery();
    let key = config.recovery_key.as_ref().map(|k| k.expose());
    match step(recovery.state(), key.is_some()) {
        Step::Nothing => info!("encryption: cross-signing and key backup are set up"),
        Step::Unknown => {
            warn!("encryption: recovery state unknown; checked again at the next start")
        }
        Step::NeedKey => warn!(
            "encryption: this account has a key backup, but this device cannot read it; set \
             MATRIX_RECOVERY_KEY to the recovery key printed at the first start to restore it \
             (older encrypted messages stay unreadable until then)"
        ),
        Step::Recover => match recovery.recover(key.unwrap_or_default()).await {
            Ok(()) => {
                info!("encryption: identity and key backup restored with MATRIX_RECOVERY_KEY")
            }
            Err(e) => {
                error!(error = %e, "encryption: MATRIX_RECOVERY_KEY did not unlock the key backup")
            }
        },
        Step::Bootstrap => bootstrap(client, config, key).await,
    }
    if let Ok(Some(identity)) = encryption.get_user_identity(&config.user_id).await {
        let device_key = match encryption.get_own_device().await {
            Ok(Some(d)) => d.ed25519_key().map(|k| k.to_base64()).unwrap_or_default(),
            _ => String::new(),
        };
        info!(
            master_key = %identity.master_key().get_first_key().map(|k| k.to_base64()).unwrap_or_default(),
            device_id = %client.device_id().map(|d| d.to_string()).unwrap_or_default(),
            device_key,
            "encryption: the bot's cross-signing identity (compare when verifying the bot)"
        );
    }
}

async fn bootstrap(client: &Client, config: &Config, passphrase: Option<&str>) {
    let encryption = client.encryption();
    if let Err(e) = encryption.bootstrap_cross_signing_if_needed(None).await {
        // Homeservers without MSC3967 ask for the password even for the first upload.
        let retried = match (e.as_uiaa_response(), &config.auth.password) {
            (Some(uiaa), Some(password)) => {
                let mut auth = uiaa::Password::new(
                    uiaa::UserIdentifier::Matrix(uiaa::MatrixUserIdentifier::new(
                        config.user_id.localpart().to_owned(),
                    )),
                    password.expose().to_owned(),
                );
                auth.session = uiaa.session.clone();
                encryption
                    .bootstrap_cross_signing(Some(uiaa::AuthData::Password(auth)))
                    .await
            }
            _ => Err(e),
        };
        if let Err(e) = retried {
            error!(error = %e, "encryption: could not create the cross-signing identity");
            return;
        }
    }
    let recovery = encryption.recovery();
    let enabled = match passphrase {
        Some(p) => recovery.enable().with_passphrase(p).await,
        None => recovery.enable().await,
    };
    match enabled {
        Ok(_) if passphrase.is_some() => info!(
            "encryption: cross-signing and key backup set up; MATRIX_RECOVERY_KEY restores them"
        ),
        Ok(recovery_key) => {
            info!(
                "encryption: cross-signing and key backup set up; the recovery key is printed once on stderr"
            );
            show_once(&recovery_key);
        }
        Err(e) => error!(error = %e, "encryption: could not set up the key backup"),
    }
}

/// Prints the new recovery key on stderr, outside the log (it is a secret: the log may be
/// shipped elsewhere; the operator reads it once and keeps it).
fn show_once(recovery_key: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "\n================ RECOVERY KEY (shown once) ================\n\
         {recovery_key}\n\
         Keep it safe, e.g. as MATRIX_RECOVERY_KEY in .env. With it, a new state\n\
         directory restores the bot's identity and reads older encrypted messages.\n\
         ==========================================================\n"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps() {
        use RecoveryState::*;
        let table = [
            (Enabled, false, Step::Nothing),
            (Enabled, true, Step::Nothing),
            (Disabled, false, Step::Bootstrap),
            (Disabled, true, Step::Bootstrap),
            (Incomplete, true, Step::Recover),
            (Incomplete, false, Step::NeedKey),
            (Unknown, true, Step::Unknown),
        ];
        for (state, key, expected) in table {
            assert_eq!(step(state, key), expected, "{state:?} {key}");
        }
    }
}
