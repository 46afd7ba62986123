//! What the agent makes of the files people send, so that a model perceives them rather than
//! a path: pictures prepared for vision models ([`images`]), speech transcribed
//! ([`transcribe`]), PDF text extracted ([`pdf`]). Every input is hostile: decoding is bounded
//! and runs off the async threads.

pub mod images;
pub mod pdf;
pub mod transcribe;

use crate::config::{BrainConfig, Config, VisionConfig};
use crate::store::Perceived;

pub use images::{ImageError, Images, data_url};
pub use pdf::{PdfError, PdfText, Pdfs};
pub use transcribe::{TranscribeError, Transcriber, Transcript};

/// The agent's senses, shared by every turn. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Perception {
    /// Pictures for the model.
    pub images: Images,
    /// Speech to text, when configured.
    pub transcriber: Option<Transcriber>,
    /// PDF text, read in a limited child process.
    pub pdfs: Pdfs,
}

impl Perception {
    /// The senses `config` asks for.
    pub fn new(config: &Config) -> Self {
        let vision = match &config.brain {
            BrainConfig::OpenAi(c) => c.vision.clone(),
            BrainConfig::Builtin | BrainConfig::Acp(_) => VisionConfig::default(),
        };
        Self {
            images: Images::new(vision.long_edge),
            transcriber: config.transcribe.clone().map(Transcriber::new),
            pdfs: Pdfs::new(config.pdf_helper.clone()),
        }
    }
}

/// How a recording's transcript reads in a turn: "voice message, 12.4 s: “…”". `voice` and
/// `length_ms` come from the sender's message.
pub fn heard_line(perceived: &Perceived, voice: bool, length_ms: Option<u64>) -> String {
    let what = if voice { "voice message" } else { "audio" };
    let what = match length_ms {
        Some(ms) => format!("{what}, {}", crate::describe::seconds(ms)),
        None => what.to_owned(),
    };
    match perceived {
        Perceived::Heard { text } if text.is_empty() => {
            format!("{what}: (no words could be made out)")
        }
        Perceived::Heard { text } => format!("{what}: “{text}”"),
        Perceived::NotHeard { why } => format!("{what}: (not transcribed: {why})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heard_lines() {
        let heard = |t: &str| Perceived::Heard { text: t.into() };
        let cases = [
            (
                heard("hi there"),
                true,
                Some(12_400),
                "voice message, 12.4 s: “hi there”",
            ),
            (heard("hi"), false, None, "audio: “hi”"),
            (
                heard(""),
                true,
                Some(1000),
                "voice message, 1.0 s: (no words could be made out)",
            ),
            (
                Perceived::NotHeard {
                    why: "the transcription server cannot be reached".into(),
                },
                true,
                None,
                "voice message: (not transcribed: the transcription server cannot be reached)",
            ),
        ];
        for (p, voice, ms, want) in cases {
            assert_eq!(heard_line(&p, voice, ms), want);
        }
    }
}
