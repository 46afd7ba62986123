//! One chat's open log and the index kept in memory for it (fixed-size slots, hashed ids):
//! admission, appends (each fsynced before it counts) and reads of recent turns.

use super::lines::*;
use super::*;

/// Where a turn's lines are and what is known of it without reading them.
#[derive(Debug, Clone, Copy)]
pub(super) struct TurnSlot {
    /// Offset of its `turn` line.
    pub(super) at: u64,
    /// Offset of its latest `end` line; 0 (the header's offset) while there is none.
    pub(super) end: u64,
    /// Its sequence number.
    pub(super) seq: u64,
    /// Attachments of the turns before it, for [`History::attachments`].
    pub(super) attachments_before: u64,
}

/// One chat's log, open, with the index that stays in memory: per turn a fixed-size slot
/// and an 8-byte hash of its id (ids sharing a hash, which takes about 2^32 turns, are kept
/// in full), the ids of unfinished turns, the chat's room and its lasting approvals.
/// Nothing grows with the size of messages or answers.
#[derive(Debug)]
pub struct ChatLog {
    chat_id: ChatId,
    path: PathBuf,
    dir: PathBuf,
    /// Opened on load or by the first change.
    file: Option<Arc<File>>,
    /// Length of the whole lines in the file: where the next line goes.
    len: u64,
    /// A failed append may have left bytes past `len`: they are cut before the next one.
    tail_dirty: bool,
    /// Turns in arrival order.
    turns: Vec<TurnSlot>,
    /// Hash of a turn's id → its index in `turns`.
    pub(super) by_hash: HashMap<u64, u32>,
    /// Ids whose hash an earlier id already has → index in `turns`.
    pub(super) collided: HashMap<String, u32>,
    /// Unfinished turns by index in `turns` → id.
    pending: BTreeMap<u32, String>,
    /// Completed steps of unfinished turns, by index in `turns`: `(n, offset)` in order.
    steps: HashMap<u32, Vec<(u32, u64)>>,
    /// Attachments of all turns.
    attachments: u64,
    room_id: Option<String>,
    thread_root: Option<String>,
    /// `(user, tool, resource)` allowed for good; no user: for the whole chat (older lines).
    always_allowed: BTreeSet<(Option<String>, String, String)>,
    /// Highest plausible stored `seq` ([`plausible_last_seq`] on load, then raised by admissions).
    pub(super) last_seq: u64,
}

/// The turn of `slot` with how it ended.
fn read_turn(file: &File, slot: &TurnSlot) -> io::Result<TurnRecord> {
    let Entry::Turn(mut turn) = read_entry(file, slot.at)? else {
        return Err(unexpected(slot.at));
    };
    if slot.end != 0 {
        let Entry::End(end) = read_entry(file, slot.end)? else {
            return Err(unexpected(slot.end));
        };
        turn.apply(end);
    }
    Ok(turn)
}

pub(super) fn id_hash(id: &str) -> u64 {
    let mut h = DefaultHasher::new();
    id.hash(&mut h);
    h.finish()
}

impl ChatLog {
    pub(super) fn empty(chat_id: ChatId, path: PathBuf, dir: PathBuf) -> Self {
        Self {
            chat_id,
            path,
            dir,
            file: None,
            len: 0,
            tail_dirty: false,
            turns: Vec::new(),
            by_hash: HashMap::new(),
            collided: HashMap::new(),
            pending: BTreeMap::new(),
            steps: HashMap::new(),
            attachments: 0,
            room_id: None,
            thread_root: None,
            always_allowed: BTreeSet::new(),
            last_seq: 0,
        }
    }

    fn io_error(&self) -> impl FnOnce(io::Error) -> StoreError + '_ {
        Store::io(&self.path)
    }

    /// Reads the log from the start, building the index; cuts off a torn last line.
    pub(super) fn scan(&mut self, file: File) -> Result<(), StoreError> {
        let mut reader = BufReader::with_capacity(1 << 16, &file);
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = reader
                .read_until(b'\n', &mut line)
                .map_err(self.io_error())?;
            if n == 0 {
                break;
            }
            let parsed = if line.ends_with(b"\n") {
                Some(serde_json::from_slice::<Probe>(&line))
            } else {
                None
            };
            match parsed {
                Some(Ok(probe)) => {
                    self.index(probe, self.len, &file)?;
                    self.len += n as u64;
                }
                Some(Err(source)) if !reader.fill_buf().map_err(self.io_error())?.is_empty() => {
                    return Err(StoreError::Corrupt {
                        path: self.path.clone(),
                        source,
                    });
                }
                _ => {
                    // The last line, written when the agent stopped: never acknowledged.
                    warn!(
                        chat_id = %self.chat_id,
                        offset = self.len,
                        bytes = n,
                        "cutting off a torn last line of the chat's log"
                    );
                    file.set_len(self.len).map_err(self.io_error())?;
                    file.sync_all().map_err(self.io_error())?;
                    break;
                }
            }
        }
        drop(reader);
        self.file = Some(Arc::new(file));
        Ok(())
    }

    /// Adds one line read at `at` to the index.
    fn index(&mut self, probe: Probe, at: u64, file: &File) -> Result<(), StoreError> {
        match probe {
            Probe::Header { version } if version > FORMAT_VERSION => {
                return Err(StoreError::Version {
                    path: self.path.clone(),
                    version,
                });
            }
            Probe::Header { .. } => {}
            Probe::Room {
                room_id,
                thread_root,
            } => {
                self.room_id = Some(room_id);
                self.thread_root = thread_root;
            }
            Probe::Turn {
                id,
                seq,
                status,
                attachments,
                context,
            } => {
                let count =
                    attachments.len() + context.iter().map(|c| c.attachments.len()).sum::<usize>();
                let known = match self.collided.contains_key(&id) {
                    true => true,
                    false => match self.by_hash.get(&id_hash(&id)) {
                        Some(&i) => {
                            let slot = self.turns[i as usize];
                            turn_id_at(file, slot.at).map_err(self.io_error())? == id
                        }
                        None => false,
                    },
                };
                if known {
                    warn!(chat_id = %self.chat_id, turn = %id, "a turn stored twice; the first counts");
                    return Ok(());
                }
                self.add_turn(id, seq, status, count as u64, at);
            }
            Probe::End { id, status } => {
                if let Some(i) = self.locate_stored(&id) {
                    self.turns[i as usize].end = at;
                    if status == TurnStatus::Pending {
                        self.pending.insert(i, id);
                    } else {
                        self.pending.remove(&i);
                        self.steps.remove(&i);
                    }
                }
            }
            Probe::Step { turn, n } => {
                if let Some(i) = self.locate_stored(&turn)
                    && self.pending.contains_key(&i)
                {
                    self.index_step(i, n, at);
                }
            }
            Probe::Allow {
                tool,
                resource,
                user,
            } => {
                self.always_allowed.insert((user, tool, resource));
            }
        }
        Ok(())
    }

    fn add_turn(&mut self, id: String, seq: u64, status: TurnStatus, attachments: u64, at: u64) {
        let index = u32::try_from(self.turns.len()).unwrap_or(u32::MAX);
        self.turns.push(TurnSlot {
            at,
            end: 0,
            seq,
            attachments_before: self.attachments,
        });
        self.attachments += attachments;
        match self.by_hash.entry(id_hash(&id)) {
            HashEntry::Vacant(v) => {
                v.insert(index);
            }
            HashEntry::Occupied(_) => {
                self.collided.insert(id.clone(), index);
            }
        }
        if status == TurnStatus::Pending {
            self.pending.insert(index, id);
        }
    }

    /// Index of the turn `id`, known to be stored (a hash match is not checked).
    fn locate_stored(&self, id: &str) -> Option<u32> {
        self.collided
            .get(id)
            .or_else(|| self.by_hash.get(&id_hash(id)))
            .copied()
    }

    /// Index of the turn `id`, a hash match checked against the log.
    async fn locate(&self, id: &str) -> Result<Option<u32>, StoreError> {
        if let Some(&i) = self.collided.get(id) {
            return Ok(Some(i));
        }
        let Some(&i) = self.by_hash.get(&id_hash(id)) else {
            return Ok(None);
        };
        let at = self.turns[i as usize].at;
        let stored = self.read(move |file| turn_id_at(file, at)).await?;
        Ok((stored == id).then_some(i))
    }

    /// Runs blocking reads on the log (which exists: some turn is indexed).
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&File) -> io::Result<T> + Send + 'static,
    ) -> Result<T, StoreError> {
        let file = self.file.clone().ok_or_else(|| {
            self.io_error()(io::Error::new(io::ErrorKind::NotFound, "log not open"))
        })?;
        blocking(move || f(&file)).await.map_err(self.io_error())
    }

    /// Appends `entries` (after the header if the log is empty), fsynced when `durable`
    /// (otherwise they survive a crash of the process, and the next durable append flushes
    /// them too). Returns the offset of each entry's line; the index is the caller's to update.
    async fn append(&mut self, entries: &[Entry], durable: bool) -> Result<Vec<u64>, StoreError> {
        let mut bytes = Vec::new();
        if self.len == 0 {
            let header = Entry::Header {
                version: FORMAT_VERSION,
                chat_id: self.chat_id.clone(),
            };
            push_line(&mut bytes, &header);
        }
        let mut offsets = Vec::with_capacity(entries.len());
        for entry in entries {
            offsets.push(self.len + bytes.len() as u64);
            push_line(&mut bytes, entry);
        }
        let (file, created) = match &self.file {
            Some(file) => (file.clone(), false),
            None => {
                let file = File::options()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&self.path)
                    .map_err(self.io_error())?;
                let file = Arc::new(file);
                self.file = Some(file.clone());
                (file, true)
            }
        };
        let (at, cut, dir) = (self.len, self.tail_dirty || self.len == 0, self.dir.clone());
        let written = bytes.len() as u64;
        let result = blocking(move || {
            if cut {
                file.set_len(at)?;
            }
            file.write_all_at(&bytes, at)?;
            if durable || created {
                file.sync_data()?;
            }
            if created {
                File::open(&dir)?.sync_all()?;
            }
            Ok(())
        })
        .await;
        match result {
            Ok(()) => {
                self.len += written;
                self.tail_dirty = false;
                Ok(offsets)
            }
            Err(e) => {
                self.tail_dirty = true;
                Err(self.io_error()(e))
            }
        }
    }

    /// Sequence numbers of the stored turns.
    pub fn seqs(&self) -> impl Iterator<Item = u64> + '_ {
        self.turns.iter().map(|t| t.seq)
    }

    /// Whether a turn with message id `id` is stored.
    pub async fn contains(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self.locate(id).await?.is_some())
    }

    /// Stores a user message as a pending turn, durably; the first one also names the room.
    pub async fn append_turn(&mut self, msg: &UserMessage) -> Result<(), StoreError> {
        let mut entries = Vec::with_capacity(2);
        let room = (self.room_id.is_none()
            || (self.thread_root.is_none() && msg.thread_root.is_some()))
        .then(|| {
            (
                self.room_id.clone().unwrap_or_else(|| msg.room_id.clone()),
                self.thread_root.clone().or_else(|| msg.thread_root.clone()),
            )
        });
        if let Some((room_id, thread_root)) = room.clone() {
            entries.push(Entry::Room {
                room_id,
                thread_root,
            });
        }
        let turn = TurnRecord::from_message(msg);
        let attachments = turn.all_attachments().count() as u64;
        entries.push(Entry::Turn(turn));
        let offsets = self.append(&entries, true).await?;
        if let Some((room_id, thread_root)) = room {
            self.room_id = Some(room_id);
            self.thread_root = thread_root;
        }
        let at = offsets.last().copied().unwrap_or_default();
        self.add_turn(
            msg.id.clone(),
            msg.seq,
            TurnStatus::Pending,
            attachments,
            at,
        );
        Ok(())
    }

    /// Ids of the turns that have not finished, in arrival order.
    pub fn pending(&self) -> Vec<String> {
        self.pending.values().cloned().collect()
    }

    /// The pending turn `id` and what came before it; `None` if it is not pending.
    pub async fn begin(&self, id: &str) -> Result<Option<(TurnRecord, History)>, StoreError> {
        let Some(i) = self.locate(id).await? else {
            return Ok(None);
        };
        if !self.pending.contains_key(&i) {
            return Ok(None);
        }
        let pos = i as usize;
        let from = pos.saturating_sub(RECENT_TURNS);
        let slots = self.turns[from..=pos].to_vec();
        let mut turns: Vec<TurnRecord> = self
            .read(move |file| slots.iter().map(|s| read_turn(file, s)).collect())
            .await?;
        let turn = turns.pop().filter(|t| t.id == id);
        Ok(turn.map(|turn| {
            let history = History {
                earlier: pos,
                attachments: self.turns[pos].attachments_before as usize,
                recent: turns,
            };
            (turn, history)
        }))
    }

    /// The turn `id` as stored now, if there is one.
    pub async fn turn(&self, id: &str) -> Result<Option<TurnRecord>, StoreError> {
        let Some(i) = self.locate(id).await? else {
            return Ok(None);
        };
        let slot = self.turns[i as usize];
        Ok(Some(self.read(move |file| read_turn(file, &slot)).await?))
    }

    /// Records how turn `id` ended; nothing happens for an unknown id.
    pub async fn finish(&mut self, end: TurnEnd) -> Result<(), StoreError> {
        self.end(end, false).await
    }

    /// Records what the agent made of turn `id`'s attachments, durably (it is not worked out
    /// again); the turn stays as it stands.
    pub async fn perceive(
        &mut self,
        id: &str,
        perceived: BTreeMap<WorkspacePath, Perceived>,
    ) -> Result<(), StoreError> {
        let Some(current) = self.turn(id).await? else {
            return Ok(());
        };
        self.end(TurnEnd::perceived(current, perceived), true).await
    }

    /// Appends an `end` line for a stored turn (nothing happens for an unknown id). What the
    /// turn's previous `end` line perceived is kept when `end` says nothing of it.
    async fn end(&mut self, mut end: TurnEnd, durable: bool) -> Result<(), StoreError> {
        let Some(i) = self.locate_stored(&end.id) else {
            return Ok(());
        };
        let previous = self.turns[i as usize].end;
        if end.perceived.is_empty()
            && previous != 0
            && let Entry::End(before) = self.read(move |file| read_entry(file, previous)).await?
        {
            end.perceived = before.perceived;
        }
        let (id, status) = (end.id.clone(), end.status);
        // A turn's end is not fsynced: the turn's admission was (before its ack). If a power
        // loss takes this line, the turn runs again after the restart and the surface's
        // transaction ids keep its posts from appearing twice; one fsync per turn instead of two.
        let offsets = self.append(&[Entry::End(end)], durable).await?;
        self.turns[i as usize].end = offsets[0];
        if status == TurnStatus::Pending {
            self.pending.insert(i, id);
        } else {
            self.pending.remove(&i);
            self.steps.remove(&i);
        }
        Ok(())
    }

    /// Notes step `n` of turn `i` at offset `at`, unless `n` is known (the first one counts).
    fn index_step(&mut self, i: u32, n: u32, at: u64) {
        let steps = self.steps.entry(i).or_default();
        if !steps.iter().any(|&(m, _)| m == n) {
            steps.push((n, at));
        }
    }

    /// The completed steps of pending turn `id`, in the order of their numbers.
    pub async fn steps(&self, id: &str) -> Result<Vec<Step>, StoreError> {
        let Some(i) = self.locate(id).await? else {
            return Ok(Vec::new());
        };
        let mut at = self.steps.get(&i).cloned().unwrap_or_default();
        if at.is_empty() {
            return Ok(Vec::new());
        }
        at.sort_unstable();
        self.read(move |file| {
            at.iter()
                .map(|&(_, offset)| match read_entry(file, offset)? {
                    Entry::Step { step, .. } => Ok(step),
                    _ => Err(unexpected(offset)),
                })
                .collect()
        })
        .await
    }

    /// Records durably that step `n` of pending turn `id` completed (nothing happens for a
    /// turn that is not pending, or a step already recorded).
    pub async fn record_step(&mut self, id: &str, n: u32, step: &Step) -> Result<(), StoreError> {
        let Some(i) = self.locate(id).await? else {
            return Ok(());
        };
        let known = self
            .steps
            .get(&i)
            .is_some_and(|s| s.iter().any(|&(m, _)| m == n));
        if !self.pending.contains_key(&i) || known {
            return Ok(());
        }
        let entry = Entry::Step {
            turn: id.to_owned(),
            n,
            step: step.clone(),
        };
        let offsets = self.append(&[entry], true).await?;
        self.index_step(i, n, offsets[0]);
        Ok(())
    }

    /// The chat's Matrix room, known from its first turn.
    pub fn room_id(&self) -> Option<&str> {
        self.room_id.as_deref()
    }

    /// Whether `user` allowed `(tool, resource)` for good here (or a grant from before grants
    /// were per user covers it).
    pub fn is_always_allowed(&self, user: &str, key: &(String, String)) -> bool {
        let (tool, resource) = key.clone();
        self.always_allowed
            .contains(&(Some(user.to_owned()), tool.clone(), resource.clone()))
            || self.always_allowed.contains(&(None, tool, resource))
    }

    /// Remembers durably that `user` allowed `(tool, resource)` for good.
    pub async fn allow_always(
        &mut self,
        user: &str,
        key: (String, String),
    ) -> Result<(), StoreError> {
        if ChatLog::is_always_allowed(self, user, &key) {
            return Ok(());
        }
        let (tool, resource) = key;
        self.append(
            &[Entry::Allow {
                tool: tool.clone(),
                resource: resource.clone(),
                user: Some(user.to_owned()),
            }],
            true,
        )
        .await?;
        self.always_allowed
            .insert((Some(user.to_owned()), tool, resource));
        Ok(())
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(io::Error::other(e)))
}

/// Everything a chat's log holds, for moving it into a database (`agent import-state`).
#[derive(Debug)]
pub struct Exported {
    /// The chat's room and thread, known from its first turn.
    pub room_id: Option<String>,
    /// The thread root, if the chat is a thread.
    pub thread_root: Option<String>,
    /// Highest plausible stored `seq`.
    pub last_seq: u64,
    /// Every turn in arrival order, with how it ended.
    pub turns: Vec<TurnRecord>,
    /// Approvals for good: `(user, tool, resource)`; no user: the whole chat.
    pub allowed: Vec<(Option<String>, String, String)>,
}

impl ChatLog {
    /// Reads every turn of the log (the whole chat in memory: for an offline import).
    pub async fn export(&self) -> Result<Exported, StoreError> {
        let turns = if self.turns.is_empty() {
            Vec::new()
        } else {
            let slots = self.turns.clone();
            self.read(move |file| slots.iter().map(|s| read_turn(file, s)).collect())
                .await?
        };
        Ok(Exported {
            room_id: self.room_id.clone(),
            thread_root: self.thread_root.clone(),
            last_seq: self.last_seq,
            turns,
            allowed: self.always_allowed.iter().cloned().collect(),
        })
    }
}
