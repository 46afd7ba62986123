//! One suite of cases both memory backends pass: the files and PostgreSQL
//! (`MXBRIDGE_TEST_DATABASE_URL`, which the test command sets).

use super::{Memory, MemoryError, Remembered, Scope};
use crate::db::test_database;

async fn backends(dir: &std::path::Path) -> Vec<Memory> {
    let mut all = vec![Memory::open(dir).unwrap()];
    if let Some(db) = test_database().await {
        all.push(Memory::postgres(db));
    }
    all
}

const ALICE: &str = "@alice:example.org";

#[tokio::test]
async fn facts_are_kept_numbered_and_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    for memory in backends(dir.path()).await {
        let alice = Scope::User(ALICE.into());
        let room = Scope::Room("!room:example.org".into());
        assert!(memory.facts(&alice).await.unwrap().is_empty());
        assert_eq!(
            memory.remember(&alice, " tea, not coffee ").await.unwrap(),
            Remembered::New("u1".into())
        );
        assert_eq!(
            memory.remember(&alice, "tea, not coffee").await.unwrap(),
            Remembered::Already("u1".into())
        );
        assert_eq!(
            memory.remember(&alice, "second").await.unwrap(),
            Remembered::New("u2".into())
        );
        memory.remember(&room, "standup at ten").await.unwrap();
        assert!(matches!(
            memory.remember(&alice, "line\nbreak").await,
            Err(MemoryError::ControlCharacter)
        ));
        let facts = memory.facts(&alice).await.unwrap();
        assert_eq!(facts.len(), 2);
        assert_eq!(facts[0].text, "tea, not coffee");
        assert!(facts[0].created_ms > 0);
        assert!(matches!(
            memory.forget(&alice, "r1").await,
            Err(MemoryError::UnknownId(_))
        ));
        assert_eq!(memory.forget(&alice, "u2").await.unwrap().text, "second");
        assert!(matches!(
            memory.forget(&alice, "u2").await,
            Err(MemoryError::UnknownId(_))
        ));
        // Never reused.
        assert_eq!(
            memory.remember(&alice, "third").await.unwrap(),
            Remembered::New("u3".into())
        );
        assert_eq!(
            memory.forget(&room, "r1").await.unwrap().text,
            "standup at ten"
        );
        assert!(memory.facts(&room).await.unwrap().is_empty());
    }
}

#[tokio::test]
async fn a_full_scope_refuses_more() {
    let dir = tempfile::tempdir().unwrap();
    for memory in backends(dir.path()).await {
        let alice = Scope::User(ALICE.into());
        for i in 0..super::MAX_FACTS {
            memory.remember(&alice, &format!("fact {i}")).await.unwrap();
        }
        let e = memory.remember(&alice, "one more").await.unwrap_err();
        assert!(matches!(e, MemoryError::Full) && e.is_refusal(), "{e}");
        assert!(matches!(
            memory.remember(&alice, "fact 3").await,
            Ok(Remembered::Already(_))
        ));
    }
}

#[tokio::test]
async fn concurrent_changes_to_one_scope_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for memory in backends(dir.path()).await {
        let alice = Scope::User(ALICE.into());
        let tasks: Vec<_> = (0..8)
            .map(|t| {
                let (memory, alice) = (memory.clone(), alice.clone());
                tokio::spawn(async move {
                    for i in 0..5 {
                        memory
                            .remember(&alice, &format!("fact {t}-{i}"))
                            .await
                            .unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let facts = memory.facts(&alice).await.unwrap();
        let mut ids: Vec<_> = facts.iter().map(|f| f.id.clone()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!((facts.len(), ids.len()), (40, 40));
    }
}
