//! PDFs are read, not dumped as bytes: `read_file` (and the builtin brain's `read`) gives the
//! page count and text, through the real `agent __pdf-text` helper under its limits; every
//! hostile file of `tests/corpus/pdf/` gives text or one clear error in bounded time, and the
//! agent stays up. Plus the bounded fuzz target of the extractor, through the same helper.

use std::path::{Path, PathBuf};

use agent::perceive::Pdfs;
use agent::perceive::pdf::PdfError;
use protocol::EndStatus;

use crate::support::*;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/pdf")
}

fn corpus(name: &str) -> Vec<u8> {
    std::fs::read(corpus_dir().join(name)).unwrap()
}

fn helper() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_agent"))
}

async fn agent() -> TestAgent {
    TestAgent::start_with(|c| c.pdf_helper = helper()).await
}

#[tokio::test]
async fn read_gives_a_pdfs_pages_and_text() {
    let agent = agent().await;
    let rel = format!("{}/report.pdf", inbox(ROOM));
    write(agent.workspace.path(), &rel, &corpus("hello-2pages.pdf"));
    let (mut c, _) = agent.connect(&chat()).await;
    let t = c.turn(message(1, "$p1", &format!("read {rel}"))).await;
    assert_eq!(t.end().status, EndStatus::Completed);
    let text = t.text();
    assert!(text.contains("PDF, 2 pages"), "{text}");
    assert!(text.contains("Quarterly report"), "{text}");
    assert!(text.contains("Second page"), "{text}");
}

#[tokio::test]
async fn hostile_pdfs_give_text_or_a_clear_error_and_never_take_the_agent_down() {
    let pdfs = Pdfs::new(helper());
    let cases: &[(&str, Result<&str, PdfError>)] = &[
        ("tounicode.pdf", Ok("Grüße, naïve café — 日本")),
        ("encrypted.pdf", Err(PdfError::Encrypted)),
        ("encrypted-empty-user.pdf", Ok("Quarterly report")),
        ("nested-30k-plain.pdf", Ok("")),
        ("nested-100k.pdf", Ok("")),
        ("pages-1m.pdf", Ok("")),
        ("pages-billion-laughs.pdf", Ok("")),
        ("pages-flat-10k.pdf", Ok("")),
        ("cyclic-pages.pdf", Ok("")),
        ("xobject-recursive.pdf", Ok("")),
        ("objstm-amplification.pdf", Err(PdfError::Limits)),
    ];
    for (name, want) in cases {
        let got = pdfs.text_of(&corpus(name)).await;
        match (want, &got) {
            (Ok(words), Ok(t)) => {
                assert!(t.text.contains(words), "{name}: {t:?}");
                assert!(t.pages >= 1, "{name}");
            }
            (Err(e), Err(g)) => assert_eq!(e, g, "{name}"),
            _ => panic!("{name}: expected {want:?}, got {got:?}"),
        }
    }
    // Damaged files: an error or no text, never a panic or a hang.
    for name in [
        "truncated.pdf",
        "garbage.pdf",
        "flate-bomb.pdf",
        "nested-content-100k.pdf",
    ] {
        let got = pdfs.text_of(&corpus(name)).await;
        eprintln!("{name}: {got:?}");
    }
    // And the tool says so in the room's words.
    let agent = agent().await;
    let rel = format!("{}/locked.pdf", inbox(ROOM));
    write(agent.workspace.path(), &rel, &corpus("encrypted.pdf"));
    let (mut c, _) = agent.connect(&chat()).await;
    let t = c.turn(message(1, "$p2", &format!("read {rel}"))).await;
    assert_eq!(t.end().status, EndStatus::Completed);
    assert!(
        t.text().contains("the PDF is encrypted with a password"),
        "{}",
        t.text()
    );
}

/// The model is told a PDF's page count on the turn it arrives.
#[tokio::test]
async fn the_model_learns_a_pdfs_page_count_with_its_turn() {
    use agent::config::{BrainConfig, OpenAiConfig};
    let fake = crate::openai::Fake::default();
    let base = fake.start(vec![]).await;
    let agent = TestAgent::start_with(|c| {
        c.pdf_helper = helper();
        c.brain = BrainConfig::OpenAi(OpenAiConfig::new(base, "m", None));
    })
    .await;
    let rel = format!("{}/report.pdf", inbox(ROOM));
    let bytes = corpus("hello-2pages.pdf");
    let path = write(agent.workspace.path(), &rel, &bytes);
    let mut m = message(1, "$p3", "summarize this");
    m.attachment_info.insert(
        path.clone(),
        protocol::AttachmentInfo {
            name: "report.pdf".into(),
            mime: "application/pdf".into(),
            size: bytes.len() as u64,
            duration_ms: None,
            voice: false,
            inode: None,
        },
    );
    m.attachments.push(path);
    let (mut c, _) = agent.connect(&chat()).await;
    assert_eq!(c.turn(m).await.end().status, EndStatus::Completed);
    let requests = fake.requests.lock().unwrap();
    let messages = requests[0].1["messages"].as_array().unwrap();
    let text = messages.last().unwrap()["content"].as_str().unwrap();
    assert!(
        text.contains("[PDF, 2 pages; read_file gives its text]"),
        "{text}"
    );
}

/// Bounded fuzzing (`MXBRIDGE_FUZZ_MS`) of the extractor, through the helper and its limits:
/// every input gives an answer, and a well-formed one that says it has pages.
#[test]
fn fuzz_pdf_text() {
    let seeds = fuzzkit::seed_files(&corpus_dir());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let pdfs = Pdfs::new(helper());
    fuzzkit::run("pdf_text", |u| {
        let bytes = fuzzkit::mutate_bytes(u, &seeds)?;
        // An error is a fine answer; a text must be consistent.
        if let Ok(t) = runtime.block_on(pdfs.text_of(&bytes)) {
            assert!(t.pages >= 1 && t.read <= t.pages, "{t:?}");
        }
        Ok(())
    });
}
