//! What the comparators say dominates a missed target: a best-effort one-line hint computed from
//! the measured medians. Pure.

use std::collections::BTreeMap;

use super::figures::{Fig, Leg, Room, Stat};

/// The medians over the runs: this project's value and the comparator's, per figure.
pub type Medians = BTreeMap<Fig, (Option<f64>, Option<f64>)>;

/// How busy the processor was during a transfer, in cores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Busy {
    /// The surface.
    pub surface: f64,
    /// Synapse.
    pub synapse: f64,
    /// The machine's cores.
    pub of: f64,
    /// The whole machine (every process and the kernel), when measured.
    pub machine: Option<f64>,
}

/// Cores Synapse can keep busy serving media: one Python process, whose threads take turns
/// holding its interpreter lock (the GIL), gets about one core; from this much on it is taken
/// to be at its limit.
const SYNAPSE_LIMIT: f64 = 0.85;

impl Busy {
    /// The hint when the machine (or, unmeasured, the two) kept (nearly) every core busy.
    fn saturated(&self) -> Option<String> {
        let two = self.surface + self.synapse;
        match self.machine {
            Some(m) if m >= 0.85 * self.of => Some(format!(
                "the processor is saturated: {m:.2} of {:.0} cores busy (the surface {:.2}, \
                 Synapse {:.2}, {:.2} the kernel and the rest: writing the file out, the network)",
                self.of,
                self.surface,
                self.synapse,
                (m - two).max(0.0)
            )),
            None if two >= 0.85 * self.of => Some(format!(
                "the processor is saturated: the surface kept {:.2} cores busy and Synapse {:.2}, \
                 of {:.0}",
                self.surface, self.synapse, self.of
            )),
            _ => None,
        }
    }

    /// The hint when Synapse, serving the download, was at its limit (and the processor was
    /// not): its pace is the surface's. `for_curl` is Synapse's cores while serving curl; with
    /// both rates (MiB/s) it gives what a GiB cost Synapse for each.
    fn synapse_bound(&self, for_curl: Option<f64>, this: f64, curl: f64) -> Option<String> {
        if self.synapse < SYNAPSE_LIMIT {
            return None;
        }
        let curl = for_curl.map_or(String::new(), |c| {
            format!(
                " ({c:.2} while serving curl's; {:.1} CPU seconds per GiB for the surface, {:.1} \
                 for curl)",
                per_gib(self.synapse, this),
                per_gib(c, curl)
            )
        });
        let idle = self.machine.map_or(String::new(), |m| {
            format!(
                ", {:.2} of {:.0} cores idle",
                (self.of - m).max(0.0),
                self.of
            )
        });
        Some(format!(
            "Synapse is at its limit: it kept {:.2} cores busy serving the surface's download{curl}, \
             about all one Python process gets (its threads take turns holding the GIL); the \
             surface {:.2} cores{idle}",
            self.synapse, self.surface
        ))
    }
}

/// CPU seconds a GiB cost Synapse, from its busy cores while serving at `rate` MiB/s.
fn per_gib(cores: f64, rate: f64) -> f64 {
    1024.0 * cores / rate
}

/// One inbound transfer's rates (MiB/s) next to the reader that keeps nothing, and Synapse's
/// cores while serving each.
#[derive(Debug, Clone, Copy)]
struct Pace {
    this: f64,
    curl: f64,
    null: Option<f64>,
    synapse: Option<f64>,
    for_curl: Option<f64>,
    for_null: Option<f64>,
}

impl Pace {
    /// The hint when Synapse's pace, not the surface's work, decides: curl downloading to
    /// `/dev/null` (reading, keeping nothing) missed the target against curl writing the file,
    /// and the surface was within 10% of it or faster. Doing less than the surface does cannot
    /// reach curl then; what a GiB cost Synapse for each reader shows why.
    fn hint(&self) -> Option<String> {
        let null = self.null?;
        if null >= 0.9 * self.curl || self.this < 0.9 * null {
            return None;
        }
        let cost = match (self.synapse, self.for_null, self.for_curl) {
            (Some(s), Some(n), Some(c)) => format!(
                "; a GiB cost Synapse {:.1} CPU seconds serving the surface, {:.1} serving \
                 curl→null, {:.1} serving curl writing the file: the faster its reader drains \
                 the socket, the more each byte costs it",
                per_gib(s, self.this),
                per_gib(n, null),
                per_gib(c, self.curl)
            ),
            _ => String::new(),
        };
        Some(format!(
            "Synapse's pace, not the surface's work: a reader that keeps nothing (curl to \
             /dev/null) got {null:.0} MiB/s, {:.2}× curl writing the file, and the surface \
             {:.2}× that{cost}",
            null / self.curl,
            self.this / null
        ))
    }

    /// What the reader that keeps nothing got, for a hint that names Synapse otherwise.
    fn aside(&self) -> String {
        let Some(null) = self.null else {
            return String::new();
        };
        let cost = self.for_null.map_or(String::new(), |n| {
            format!(
                ", a GiB costing Synapse {:.1} CPU seconds",
                per_gib(n, null)
            )
        });
        format!("; curl→null, the reader that keeps nothing, got {null:.0} MiB/s{cost}")
    }
}

/// The figures a hint weighs, taken from the medians.
#[derive(Debug, Clone, PartialEq)]
pub enum Clue {
    /// Download into the inbox, rates in MiB/s.
    Inbound {
        /// Encrypted room (the surface also decrypts).
        encrypted: bool,
        /// The surface.
        this: f64,
        /// curl without fsync.
        curl: f64,
        /// curl plus an fsync of the file.
        curl_fsync: Option<f64>,
        /// SHA-256 rate of the machine.
        sha: Option<f64>,
        /// The processor during the transfer.
        busy: Option<Busy>,
        /// Synapse's cores while serving curl's download.
        synapse_for_curl: Option<f64>,
        /// curl downloading to `/dev/null`: the reader that keeps nothing.
        null: Option<f64>,
        /// Synapse's cores while serving that download.
        synapse_for_null: Option<f64>,
    },
    /// Upload of the agent's file, times in seconds.
    Outbound {
        /// Encrypted room (the surface also encrypts).
        encrypted: bool,
        /// The surface's upload.
        this_s: f64,
        /// curl uploading the same file.
        curl_s: f64,
        /// The file's size over the machine's SHA-256 rate.
        sha_s: Option<f64>,
        /// The processor during the transfer.
        busy: Option<Busy>,
    },
    /// The surface's own latency on one leg, ms.
    Leg {
        /// Median.
        p50: f64,
        /// 99th percentile.
        p99: f64,
        /// Largest.
        max: f64,
        /// Of the sync leg, the 99th percentile of the part inside matrix-sdk.
        sdk_p99: Option<f64>,
        /// Of that, the 99th percentile of its crypto machine's share.
        crypto_p99: Option<f64>,
        /// Of that, the 99th percentile of saving its state store.
        state_p99: Option<f64>,
        /// The machine's fsync, p50 and p99, ms: what each store commit waits for.
        fsync_ms: Option<(f64, f64)>,
        /// Of the sync leg, the 99th percentile of the surface's own part (after the SDK).
        own_p99: Option<f64>,
        /// Of the surface's own part, the 99th percentiles until the journal's commit and from
        /// there to the frame at the agent.
        own_parts: Option<(f64, f64)>,
    },
    /// Reply latency, ms.
    Reply {
        /// The bot, back to back.
        bot: f64,
        /// The echo bot, back to back.
        echo: f64,
        /// The bot, paced.
        bot_paced: Option<f64>,
        /// The surface's own p50s, both legs added (if instrumented).
        surface: Option<f64>,
    },
    /// Messages answered per second.
    Throughput {
        /// The bot.
        bot: f64,
        /// The echo bot.
        echo: f64,
        /// How many rooms (1 for the one-room figure).
        rooms: usize,
        /// The bot's one-room rate (for the many-rooms figure).
        one_room: Option<f64>,
        /// The bot's back-to-back reply p50, ms.
        reply_ms: Option<f64>,
        /// The share of the bot's burst spent sending, %.
        sending: Option<f64>,
        /// The bot's read receipts and typing notices per message.
        progress: Option<f64>,
    },
    /// Surface RSS growth in one transfer, MiB.
    Rss {
        /// Encrypted room.
        encrypted: bool,
        /// Growth.
        growth: f64,
        /// The file.
        size: f64,
    },
    /// Bytes uploaded by the second send of the same file, MiB.
    Again {
        /// Encrypted room.
        encrypted: bool,
        /// Uploaded the second time.
        uploaded: f64,
        /// The file.
        size: f64,
    },
}

/// Within `tolerance` (a fraction of `b`).
fn near(a: f64, b: f64, tolerance: f64) -> bool {
    (a - b).abs() <= tolerance * b.abs()
}

/// The one-line hint for a missed target.
pub fn hint(clue: &Clue) -> String {
    match *clue {
        Clue::Inbound {
            encrypted,
            this,
            curl,
            curl_fsync,
            sha,
            busy,
            synapse_for_curl,
            null,
            synapse_for_null,
        } => {
            // An encrypted file costs what curl never does: the ciphertext's SHA-256 (the
            // integrity check) and its decryption. The hash's share of the surface's cores, when
            // both are measured, goes with whatever else dominates.
            let hash_share = match (encrypted, sha, busy.as_ref()) {
                (true, Some(sha), Some(b)) => format!(
                    "; the ciphertext's SHA-256 check, which curl does not do, takes {:.2} of the \
                     surface's {:.2} cores (SHA-256 runs at {sha:.0} MiB/s here)",
                    this / sha,
                    b.surface
                ),
                _ => String::new(),
            };
            let pace = Pace {
                this,
                curl,
                null,
                synapse: busy.map(|b| b.synapse),
                for_curl: synapse_for_curl,
                for_null: synapse_for_null,
            };
            if let Some(h) = busy
                .as_ref()
                .and_then(Busy::saturated)
                .or_else(|| pace.hint())
                .or_else(|| {
                    busy.as_ref()
                        .and_then(|b| b.synapse_bound(synapse_for_curl, this, curl))
                        .map(|h| format!("{h}{}", pace.aside()))
                })
            {
                return format!("{h}{hash_share}");
            }
            let t = 1.0 / this;
            let main: String = match (curl_fsync, sha) {
                (Some(f), _) if near(this, f, 0.1) => {
                    "as fast as curl+fsync (within 10%): the surface's file is on the disk when \
                     it is done, curl's without fsync only in memory"
                        .into()
                }
                // The ciphertext is hashed beside the download, on its own thread: only a hash
                // rate near the download's own rate can hold it back.
                (_, Some(sha)) if encrypted && near(this, sha, 0.15) => format!(
                    "hashing the ciphertext keeps pace with it: SHA-256 runs at {sha:.0} MiB/s here"
                ),
                (Some(f), _) if this < f => format!(
                    "{:.0}% of the time is beyond curl+fsync: the surface's download path",
                    100.0 * (t - 1.0 / f) / t
                ),
                // Faster than curl+fsync, slower than curl: the surface has the file on the disk
                // when it is done, curl without fsync only in memory.
                (Some(f), _) => format!(
                    "durability: {:.2}× curl+fsync, the file is on the disk when the download \
                     ends (written out during it), curl's without fsync still in memory",
                    this / f
                ),
                _ => format!(
                    "{:.0}% slower than curl, not explained by fsync",
                    100.0 * (t * curl - 1.0)
                ),
            };
            format!("{main}{hash_share}")
        }
        Clue::Outbound {
            encrypted,
            this_s,
            curl_s,
            sha_s,
            busy,
        } => {
            if let Some(h) = busy.as_ref().and_then(Busy::saturated) {
                return h;
            }
            // A small file is hashed before it is uploaded (deduplication by content); a large one
            // is not, and an encrypted one's ciphertext is hashed by a second read beside the
            // upload: that only shows when the processor has no core to spare for it.
            match sha_s {
                Some(sha) if !encrypted && near(this_s, sha + curl_s, 0.15) => format!(
                    "hashing not overlapped with the upload: time ≈ size/SHA-256 rate + upload \
                     ({sha:.2} + {curl_s:.2} s)"
                ),
                _ => format!(
                    "{:.2} s ({:.2}×) beyond curl's upload: the surface's upload path",
                    this_s - curl_s,
                    this_s / curl_s
                ),
            }
        }
        Clue::Leg {
            p50,
            p99,
            max,
            sdk_p99,
            crypto_p99,
            state_p99,
            fsync_ms,
            own_p99,
            own_parts,
        } => {
            let parts = own_parts.map_or(String::new(), |(journal, lane)| {
                format!(
                    ": {journal:.1} until its journal's commit, {lane:.1} from there to the agent"
                )
            });
            if let Some(sdk) = sdk_p99.filter(|s| *s >= 0.5 * p99) {
                let crypto = crypto_p99.map_or(String::new(), |c| {
                    format!(
                        "; {c:.1} ms (p99) of it in its crypto machine's per-sync work (key counts, \
                         to-device, two crypto store commits)"
                    )
                });
                let state = state_p99.map_or(String::new(), |s| {
                    format!("; {s:.1} ms (p99) saving its state store (one commit)")
                });
                let fsync = fsync_ms.map_or(String::new(), |(p50, p99)| {
                    format!(
                        "; every commit waits for an fsync (this disk alone: p50 {p50:.2}, p99 \
                         {p99:.2} ms)"
                    )
                });
                let own = own_p99.map_or(String::new(), |o| {
                    format!("; the surface's own part after it: {o:.1} ms (p99){parts}")
                });
                format!(
                    "matrix-sdk dominates: {sdk:.1} of the {p99:.1} ms (p99) pass before it hands \
                     the events over (parsing, decryption, its stores){crypto}{state}{fsync}{own}"
                )
            } else if let (Some(own), Some((journal, lane))) = (own_p99, own_parts) {
                let what = if journal >= lane {
                    "its journal (reading the room, the commit's fsync)"
                } else {
                    "the way from the journal to the agent (the lane, the socket)"
                };
                format!("the surface's own part dominates, {own:.1} ms (p99){parts}: {what}")
            } else if p50 > p99 * 0.5 {
                format!("every message is slow on this leg (p50 {p50:.1} ms)")
            } else if near(p99, max, 0.01) {
                format!("a few outliers (p99 = max = {max:.1} ms, p50 {p50:.1} ms)")
            } else {
                format!("tail only (p50 {p50:.1} ms, p99 {p99:.1} ms): occasional stalls")
            }
        }
        Clue::Reply {
            bot,
            echo,
            bot_paced,
            surface,
        } => {
            let extra = bot - echo;
            match (surface, bot_paced) {
                (Some(s), _) if s >= 0.5 * extra => {
                    format!(
                        "the surface's own legs: {s:.0} ms (p50s added) of the {extra:.0} ms over echo"
                    )
                }
                (_, Some(p)) if bot > 1.5 * p => format!(
                    "back to back is slower than paced ({bot:.0} vs {p:.0} ms): the next message waits for the previous turn or a sync"
                ),
                _ if echo > 300.0 => format!(
                    "sync round trips dominate: the echo bot takes {echo:.0} ms too; the bot adds {extra:.0} ms"
                ),
                (s, _) => format!(
                    "the agent turn and extra round trips: +{extra:.0} ms over echo (surface legs: {})",
                    s.map_or("not instrumented".to_owned(), |s| format!("{s:.1} ms"))
                ),
            }
        }
        Clue::Throughput {
            bot,
            echo,
            rooms,
            one_room,
            reply_ms,
            sending,
            progress,
        } => match (one_room, reply_ms) {
            _ if sending.is_some_and(|p| p >= 80.0) => format!(
                "the user's sends set the pace ({:.0}% of the time): the homeserver is the bottleneck",
                sending.unwrap_or_default()
            ),
            _ if progress.is_some_and(|p| p >= 0.5) => format!(
                "the bot's read receipts and typing notices: {:.1} requests per message besides \
                 the answer, each one the homeserver serves (the echo bot sends none)",
                progress.unwrap_or_default()
            ),
            (Some(one), _) if rooms > 1 && bot <= 1.2 * one => {
                format!("no parallelism across rooms: {rooms} rooms ≈ one room ({one:.1} msg/s)")
            }
            (_, Some(ms)) if rooms == 1 && near(bot * ms / 1000.0, 1.0, 0.3) => {
                format!("turns run one at a time: rate ≈ 1 / reply latency ({ms:.0} ms)")
            }
            _ => format!(
                "{:.1}× slower than echo: per-message overhead in the surface or agent",
                echo / bot
            ),
        },
        Clue::Rss {
            encrypted,
            growth,
            size,
        } => {
            if growth >= 0.5 * size {
                let why = if encrypted {
                    " (the encryption or decryption buffers it?)"
                } else {
                    ""
                };
                format!("the file is held in memory: {growth:.0} MiB for {size:.0} MiB{why}")
            } else {
                format!(
                    "grows {growth:.0} MiB, less than half the file: large buffers or queued chunks"
                )
            }
        }
        Clue::Again {
            encrypted,
            uploaded,
            size,
        } => {
            if uploaded < 0.9 * size {
                format!("partly uploaded again ({uploaded:.1} of {size:.1} MiB)")
            } else if encrypted {
                "re-uploaded: encrypted media is not reused (a fresh key per upload)".into()
            } else {
                "re-uploaded: no cache of already uploaded content".into()
            }
        }
    }
}

/// The clue for figure `fig` from the medians, `None` when a needed figure is missing or the
/// figure has no hint. `size_mib` is the transfer size, `rooms` is `--rooms`.
pub fn clue(fig: Fig, m: &Medians, size_mib: f64, rooms: usize) -> Option<Clue> {
    let this = |f: Fig| m.get(&f).and_then(|v| v.0);
    let other = |f: Fig| m.get(&f).and_then(|v| v.1);
    let sha = this(Fig::Sha);
    let b2b_p50 = Fig::Reply {
        paced: false,
        stat: Stat::P50,
    };
    let reply_p50 = this(b2b_p50);
    let of = std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64);
    let busy = |f: Fig, machine: Fig| {
        Some(Busy {
            surface: this(f)?,
            synapse: other(f)?,
            of,
            machine: this(machine),
        })
    };
    Some(match fig {
        Fig::Inbound(room) => Clue::Inbound {
            encrypted: room == Room::Encrypted,
            this: this(fig)?,
            curl: other(fig)?,
            curl_fsync: other(Fig::InboundFsync(room)),
            sha,
            busy: busy(Fig::InboundCpu(room), Fig::InboundMachine(room)),
            synapse_for_curl: this(Fig::InboundSynapseCurl(room)),
            null: other(Fig::InboundNull(room)),
            synapse_for_null: other(Fig::InboundSynapseCurl(room)),
        },
        Fig::Outbound(room) => Clue::Outbound {
            encrypted: room == Room::Encrypted,
            this_s: size_mib / this(fig)?,
            curl_s: size_mib / other(fig)?,
            sha_s: sha.map(|s| size_mib / s),
            busy: busy(Fig::OutboundCpu(room), Fig::OutboundMachine(room)),
        },
        Fig::Surface(leg, _) => Clue::Leg {
            p50: this(Fig::Surface(leg, Stat::P50))?,
            p99: this(Fig::Surface(leg, Stat::P99))?,
            max: this(Fig::Surface(leg, Stat::Max))?,
            sdk_p99: (leg == Leg::SyncToAgent)
                .then(|| this(Fig::Surface(Leg::SdkSync, Stat::P99)))
                .flatten(),
            crypto_p99: (leg == Leg::SyncToAgent)
                .then(|| this(Fig::Surface(Leg::SdkCrypto, Stat::P99)))
                .flatten(),
            state_p99: (leg == Leg::SyncToAgent)
                .then(|| this(Fig::Surface(Leg::SdkState, Stat::P99)))
                .flatten(),
            fsync_ms: (leg == Leg::SyncToAgent)
                .then(|| Some((other(Fig::FsyncP99)?, this(Fig::FsyncP99)?)))
                .flatten(),
            own_p99: (leg == Leg::SyncToAgent)
                .then(|| this(Fig::Surface(Leg::SurfaceSync, Stat::P99)))
                .flatten(),
            own_parts: (leg == Leg::SyncToAgent)
                .then(|| {
                    Some((
                        this(Fig::Surface(Leg::SurfaceJournal, Stat::P99))?,
                        this(Fig::Surface(Leg::SurfaceLane, Stat::P99))?,
                    ))
                })
                .flatten(),
        },
        Fig::Reply { .. } => Clue::Reply {
            bot: reply_p50?,
            echo: other(b2b_p50)?,
            bot_paced: this(Fig::Reply {
                paced: true,
                stat: Stat::P50,
            }),
            surface: Leg::WHOLE
                .iter()
                .map(|l| this(Fig::Surface(*l, Stat::P50)))
                .sum(),
        },
        Fig::OneRoom | Fig::Rooms => Clue::Throughput {
            bot: this(fig)?,
            echo: other(fig)?,
            rooms: if fig == Fig::Rooms { rooms } else { 1 },
            one_room: (fig == Fig::Rooms).then(|| this(Fig::OneRoom)).flatten(),
            reply_ms: reply_p50,
            sending: this(if fig == Fig::Rooms {
                Fig::RoomsSending
            } else {
                Fig::OneRoomSending
            }),
            progress: this(if fig == Fig::Rooms {
                Fig::RoomsProgress
            } else {
                Fig::OneRoomProgress
            }),
        },
        Fig::InboundRss(room) | Fig::OutboundRss(room) => Clue::Rss {
            encrypted: room == Room::Encrypted,
            growth: this(fig)?,
            size: size_mib,
        },
        Fig::OutboundAgainBytes(room) => Clue::Again {
            encrypted: room == Room::Encrypted,
            uploaded: this(fig)?,
            size: size_mib,
        },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inbound(this: f64, curl_fsync: Option<f64>, sha: Option<f64>) -> Clue {
        Clue::Inbound {
            encrypted: false,
            this,
            curl: 1000.0,
            curl_fsync,
            sha,
            busy: None,
            synapse_for_curl: None,
            null: None,
            synapse_for_null: None,
        }
    }

    /// `clue` (an inbound one) with curl→null's rate.
    fn beside_null(mut clue: Clue, rate: f64) -> Clue {
        if let Clue::Inbound { null, .. } = &mut clue {
            *null = Some(rate);
        }
        clue
    }

    fn outbound(this_s: f64, sha_s: Option<f64>) -> Clue {
        Clue::Outbound {
            encrypted: false,
            this_s,
            curl_s: 4.0,
            sha_s,
            busy: None,
        }
    }

    /// An encrypted upload of 0.86 s (hashing 0.17 s, curl 0.68 s) with the given cores busy.
    fn encrypted_outbound(surface: f64, synapse: f64) -> Clue {
        encrypted_outbound_on(surface, synapse, None)
    }

    /// The same, with the whole machine's busy cores measured too.
    fn encrypted_outbound_on(surface: f64, synapse: f64, machine: Option<f64>) -> Clue {
        Clue::Outbound {
            encrypted: true,
            this_s: 0.86,
            curl_s: 0.68,
            sha_s: Some(0.17),
            busy: Some(Busy {
                surface,
                synapse,
                of: 2.0,
                machine,
            }),
        }
    }

    fn reply(bot: f64, echo: f64, paced: Option<f64>, surface: Option<f64>) -> Clue {
        Clue::Reply {
            bot,
            echo,
            bot_paced: paced,
            surface,
        }
    }

    fn throughput(bot: f64, rooms: usize, one: Option<f64>, reply_ms: Option<f64>) -> Clue {
        Clue::Throughput {
            bot,
            echo: 100.0,
            rooms,
            one_room: one,
            reply_ms,
            sending: Some(50.0),
            progress: Some(0.0),
        }
    }

    #[test]
    fn hints_name_what_dominates() {
        let cases: Vec<(Clue, &str)> = vec![
            (
                inbound(400.0, Some(420.0), Some(2000.0)),
                "as fast as curl+fsync (within 10%)",
            ),
            // 1/400 - 1/800 of 1/400: half the time beyond curl+fsync.
            (
                inbound(400.0, Some(800.0), Some(2000.0)),
                "50% of the time is beyond curl+fsync",
            ),
            (inbound(800.0, None, None), "25% slower than curl"),
            (
                inbound(800.0, Some(500.0), None),
                "durability: 1.60× curl+fsync, the file is on the disk when the download ends",
            ),
            // Plain files are not hashed on the way in: the hash rate says nothing then.
            (inbound(500.0, None, Some(520.0)), "100% slower than curl"),
            (
                Clue::Inbound {
                    encrypted: true,
                    this: 500.0,
                    curl: 1000.0,
                    curl_fsync: None,
                    sha: Some(520.0),
                    busy: None,
                    synapse_for_curl: None,
                    null: None,
                    synapse_for_null: None,
                },
                "hashing the ciphertext keeps pace with it: SHA-256 runs at 520 MiB/s",
            ),
            (
                Clue::Inbound {
                    encrypted: true,
                    this: 700.0,
                    curl: 1000.0,
                    curl_fsync: Some(600.0),
                    sha: Some(2000.0),
                    busy: Some(Busy {
                        surface: 0.9,
                        synapse: 0.6,
                        of: 2.0,
                        machine: Some(1.6),
                    }),
                    synapse_for_curl: None,
                    null: None,
                    synapse_for_null: None,
                },
                "durability: 1.17× curl+fsync, the file is on the disk when the download ends \
                 (written out during it), curl's without fsync still in memory; the \
                 ciphertext's SHA-256 check, which curl does not do, takes 0.35 of the \
                 surface's 0.90 cores (SHA-256 runs at 2000 MiB/s here)",
            ),
            // Synapse at its one core, the machine not saturated: Synapse sets the pace, whatever
            // curl+fsync says.
            (
                Clue::Inbound {
                    encrypted: false,
                    this: 350.0,
                    curl: 390.0,
                    curl_fsync: Some(290.0),
                    sha: Some(2000.0),
                    busy: Some(Busy {
                        surface: 0.37,
                        synapse: 0.91,
                        of: 2.0,
                        machine: Some(1.35),
                    }),
                    synapse_for_curl: Some(0.95),
                    null: None,
                    synapse_for_null: None,
                },
                "Synapse is at its limit: it kept 0.91 cores busy serving the surface's download \
                 (0.95 while serving curl's; 2.7 CPU seconds per GiB for the surface, 2.5 for \
                 curl), about all one Python process gets (its threads take turns holding the \
                 GIL); the surface 0.37 cores, 0.65 of 2 cores idle",
            ),
            // A reader that keeps nothing missed the target too, and the surface beat it: Synapse
            // sets the pace, and the cost per GiB says why (figures measured on one machine).
            (
                Clue::Inbound {
                    encrypted: false,
                    this: 527.0,
                    curl: 670.0,
                    curl_fsync: Some(459.0),
                    sha: Some(2000.0),
                    busy: Some(Busy {
                        surface: 0.38,
                        synapse: 0.97,
                        of: 2.0,
                        machine: Some(1.35),
                    }),
                    synapse_for_curl: Some(0.82),
                    null: Some(469.0),
                    synapse_for_null: Some(1.1),
                },
                "Synapse's pace, not the surface's work: a reader that keeps nothing (curl to \
                 /dev/null) got 469 MiB/s, 0.70× curl writing the file, and the surface 1.12× \
                 that; a GiB cost Synapse 1.9 CPU seconds serving the surface, 2.4 serving \
                 curl→null, 1.3 serving curl writing the file: the faster its reader drains the \
                 socket, the more each byte costs it",
            ),
            // The surface behind the reader that keeps nothing, Synapse at its limit: that hint,
            // with what the reader that keeps nothing got beside it.
            (
                Clue::Inbound {
                    encrypted: false,
                    this: 407.0,
                    curl: 606.0,
                    curl_fsync: Some(479.0),
                    sha: Some(2000.0),
                    busy: Some(Busy {
                        surface: 0.38,
                        synapse: 0.98,
                        of: 2.0,
                        machine: Some(1.34),
                    }),
                    synapse_for_curl: Some(0.83),
                    null: Some(488.0),
                    synapse_for_null: Some(1.09),
                },
                "Synapse is at its limit: it kept 0.98 cores busy serving the surface's download \
                 (0.83 while serving curl's; 2.5 CPU seconds per GiB for the surface, 1.4 for \
                 curl), about all one Python process gets (its threads take turns holding the \
                 GIL); the surface 0.38 cores, 0.66 of 2 cores idle; curl→null, the reader that \
                 keeps nothing, got 488 MiB/s, a GiB costing Synapse 2.3 CPU seconds",
            ),
            // Without Synapse's cores, the rates alone.
            (
                beside_null(inbound(527.0, None, None), 469.0),
                "Synapse's pace, not the surface's work: a reader that keeps nothing (curl to \
                 /dev/null) got 469 MiB/s, 0.47× curl writing the file, and the surface 1.12× \
                 that",
            ),
            // The surface well behind the reader that keeps nothing: its own path is in question.
            (
                beside_null(inbound(700.0, None, None), 900.0),
                "43% slower than curl",
            ),
            // curl→null near curl: nothing to learn from it, the other hints decide.
            (
                beside_null(inbound(800.0, Some(500.0), None), 950.0),
                "durability: 1.60× curl+fsync",
            ),
            (
                outbound(5.0, Some(1.0)),
                "hashing not overlapped with the upload",
            ),
            (
                encrypted_outbound(0.9, 0.5),
                "0.18 s (1.26×) beyond curl's upload: the surface's upload path",
            ),
            (
                encrypted_outbound(1.1, 0.7),
                "the processor is saturated: the surface kept 1.10 cores busy and Synapse 0.70, of 2",
            ),
            // Measured, the whole machine decides: the kernel's share shows.
            (
                encrypted_outbound_on(0.5, 0.9, Some(1.9)),
                "the processor is saturated: 1.90 of 2 cores busy (the surface 0.50, Synapse \
                 0.90, 0.50 the kernel and the rest",
            ),
            (
                encrypted_outbound_on(1.1, 0.7, Some(1.5)),
                "0.18 s (1.26×) beyond curl's upload",
            ),
            (
                outbound(9.0, Some(1.0)),
                "5.00 s (2.25×) beyond curl's upload",
            ),
            (outbound(6.0, None), "(1.50×) beyond curl's upload"),
            (
                Clue::Leg {
                    p50: 3.0,
                    p99: 8.0,
                    max: 9.0,
                    sdk_p99: Some(5.0),
                    crypto_p99: Some(2.5),
                    state_p99: Some(1.5),
                    fsync_ms: Some((0.2, 3.7)),
                    own_p99: Some(3.5),
                    own_parts: Some((1.2, 2.4)),
                },
                "matrix-sdk dominates: 5.0 of the 8.0 ms (p99) pass before it hands the events \
                 over (parsing, decryption, its stores); 2.5 ms (p99) of it in its \
                 crypto machine's per-sync work (key counts, to-device, two crypto store \
                 commits); 1.5 ms (p99) saving its state store (one commit); every commit waits \
                 for an fsync (this disk alone: p50 0.20, p99 3.70 ms); the surface's own part \
                 after it: 3.5 ms (p99): 1.2 until its journal's commit, 2.4 from there to the \
                 agent",
            ),
            (
                Clue::Leg {
                    p50: 3.0,
                    p99: 8.0,
                    max: 9.0,
                    sdk_p99: Some(2.0),
                    crypto_p99: None,
                    state_p99: None,
                    fsync_ms: None,
                    own_p99: Some(6.0),
                    own_parts: Some((5.0, 1.5)),
                },
                "the surface's own part dominates, 6.0 ms (p99): 5.0 until its journal's commit, \
                 1.5 from there to the agent: its journal (reading the room, the commit's fsync)",
            ),
            (
                Clue::Leg {
                    p50: 6.0,
                    p99: 8.0,
                    max: 9.0,
                    sdk_p99: Some(1.0),
                    crypto_p99: None,
                    state_p99: None,
                    fsync_ms: None,
                    own_p99: None,
                    own_parts: None,
                },
                "every message is slow",
            ),
            (
                Clue::Leg {
                    p50: 0.5,
                    p99: 30.0,
                    max: 30.0,
                    sdk_p99: None,
                    crypto_p99: None,
                    state_p99: None,
                    fsync_ms: None,
                    own_p99: None,
                    own_parts: None,
                },
                "a few outliers",
            ),
            (
                Clue::Leg {
                    p50: 0.5,
                    p99: 8.0,
                    max: 30.0,
                    sdk_p99: None,
                    crypto_p99: None,
                    state_p99: None,
                    fsync_ms: None,
                    own_p99: None,
                    own_parts: None,
                },
                "tail only",
            ),
            (
                reply(200.0, 100.0, None, Some(60.0)),
                "surface's own legs: 60 ms (p50s added) of the 100 ms",
            ),
            (
                reply(400.0, 100.0, Some(150.0), Some(5.0)),
                "back to back is slower than paced",
            ),
            (
                reply(800.0, 500.0, Some(700.0), None),
                "sync round trips dominate",
            ),
            (reply(200.0, 100.0, Some(190.0), None), "not instrumented"),
            (
                throughput(30.0, 20, Some(28.0), None),
                "no parallelism across rooms",
            ),
            (
                throughput(20.0, 1, None, Some(50.0)),
                "turns run one at a time",
            ),
            (
                throughput(25.0, 1, None, Some(10.0)),
                "4.0× slower than echo",
            ),
            (
                Clue::Throughput {
                    bot: 10.0,
                    echo: 12.0,
                    rooms: 20,
                    one_room: None,
                    reply_ms: None,
                    sending: Some(91.0),
                    progress: Some(0.0),
                },
                "sends set the pace (91% of the time)",
            ),
            // Session 12's slower machine: 20 rooms at 0.72× echo, each quick turn marked read
            // and shown typing while its answer waited behind Synapse.
            (
                Clue::Throughput {
                    bot: 15.2,
                    echo: 21.2,
                    rooms: 20,
                    one_room: Some(12.8),
                    reply_ms: None,
                    sending: Some(60.0),
                    progress: Some(2.7),
                },
                "read receipts and typing notices: 2.7 requests per message",
            ),
            (
                Clue::Rss {
                    encrypted: true,
                    growth: 1030.0,
                    size: 1024.0,
                },
                "held in memory: 1030 MiB for 1024 MiB (the encryption",
            ),
            (
                Clue::Rss {
                    encrypted: false,
                    growth: 40.0,
                    size: 1024.0,
                },
                "large buffers",
            ),
            (
                Clue::Again {
                    encrypted: false,
                    uploaded: 1024.0,
                    size: 1024.0,
                },
                "no cache",
            ),
            (
                Clue::Again {
                    encrypted: true,
                    uploaded: 1024.0,
                    size: 1024.0,
                },
                "fresh key",
            ),
            (
                Clue::Again {
                    encrypted: true,
                    uploaded: 1.0,
                    size: 1024.0,
                },
                "partly",
            ),
        ];
        for (clue, want) in cases {
            let got = hint(&clue);
            assert!(got.contains(want), "{clue:?}: {got:?} lacks {want:?}");
        }
    }

    #[test]
    fn clues_come_from_the_medians() {
        let mut m = Medians::new();
        m.insert(Fig::Sha, (Some(512.0), None));
        m.insert(Fig::Outbound(Room::Plain), (Some(128.0), Some(256.0)));
        m.insert(
            Fig::Reply {
                paced: false,
                stat: Stat::P50,
            },
            (Some(100.0), Some(50.0)),
        );
        assert_eq!(
            clue(Fig::Outbound(Room::Plain), &m, 1024.0, 20),
            Some(Clue::Outbound {
                encrypted: false,
                this_s: 8.0,
                curl_s: 4.0,
                sha_s: Some(2.0),
                busy: None,
            })
        );
        assert_eq!(
            clue(
                Fig::Reply {
                    paced: false,
                    stat: Stat::P50
                },
                &m,
                1024.0,
                20
            ),
            Some(Clue::Reply {
                bot: 100.0,
                echo: 50.0,
                bot_paced: None,
                surface: None,
            })
        );
        assert_eq!(clue(Fig::Outbound(Room::Encrypted), &m, 1024.0, 20), None);
        assert_eq!(clue(Fig::Sha, &m, 1024.0, 20), None);
    }
}
