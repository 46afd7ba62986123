//! Which agent a chat talks to when `AGENT_URL` lists several: rendezvous (highest random
//! weight) hashing of the chat id over the agents. Every chat has its own order of preference;
//! its first agent owns it, and the next ones take it while the owner cannot be reached.
//! Adding or removing an agent moves only the chats that agent gains or loses; the order of
//! the list does not matter.

use sha2::{Digest, Sha256};

/// The agents in `chat`'s order of preference (indices into `agents`).
pub fn preference<T: AsRef<str>>(chat: &str, agents: &[T]) -> Vec<usize> {
    let mut scored: Vec<(u64, usize)> = agents
        .iter()
        .enumerate()
        .map(|(i, a)| (weight(chat, a.as_ref()), i))
        .collect();
    // Highest weight first; ties (practically impossible) broken by the agent's name.
    scored.sort_by(|x, y| {
        y.0.cmp(&x.0)
            .then_with(|| agents[x.1].as_ref().cmp(agents[y.1].as_ref()))
    });
    scored.into_iter().map(|(_, i)| i).collect()
}

fn weight(chat: &str, agent: &str) -> u64 {
    let mut h = Sha256::new();
    h.update((agent.len() as u64).to_be_bytes());
    h.update(agent.as_bytes());
    h.update(chat.as_bytes());
    let d = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&d[..8]);
    u64::from_be_bytes(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "ws://agent-0.agent:8700/";
    const B: &str = "ws://agent-1.agent:8700/";
    const C: &str = "ws://agent-2.agent:8700/";

    fn owner(chat: &str, agents: &[&str]) -> String {
        agents[preference(chat, agents)[0]].to_owned()
    }

    fn chats() -> Vec<String> {
        (0..3000).map(|i| format!("!room{i}:hs")).collect()
    }

    #[test]
    fn one_agent_or_none() {
        assert_eq!(preference("c", &[A]), [0]);
        assert!(preference::<&str>("c", &[]).is_empty());
    }

    #[test]
    fn every_agent_once_and_the_list_order_does_not_matter() {
        for chat in chats().iter().take(200) {
            let p = preference(chat, &[A, B, C]);
            let mut sorted = p.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, [0, 1, 2]);
            assert_eq!(owner(chat, &[A, B, C]), owner(chat, &[C, A, B]), "{chat}");
            assert_eq!(p, preference(chat, &[A, B, C]), "stable");
        }
    }

    #[test]
    fn chats_spread_evenly() {
        for agents in [&[A, B][..], &[A, B, C][..]] {
            let n = chats().len();
            for a in agents {
                let owned = chats().iter().filter(|c| owner(c, agents) == *a).count();
                let share = owned as f64 / n as f64;
                let fair = 1.0 / agents.len() as f64;
                assert!((share - fair).abs() < 0.05, "{a} owns {share:.3} of {n}");
            }
        }
    }

    #[test]
    fn adding_or_removing_an_agent_moves_only_its_chats() {
        for chat in chats() {
            let before = owner(&chat, &[A, B]);
            let after = owner(&chat, &[A, B, C]);
            assert!(after == before || after == C, "{chat}: {before} -> {after}");
            // Without its owner, a chat goes to the next in its own order, which is where
            // it stays when the owner is removed for good.
            let p = preference(&chat, &[A, B, C]);
            let without_owner: Vec<&str> = [A, B, C]
                .into_iter()
                .filter(|a| *a != [A, B, C][p[0]])
                .collect();
            assert_eq!(owner(&chat, &without_owner), [A, B, C][p[1]], "{chat}");
        }
    }
}
