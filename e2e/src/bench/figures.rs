//! The catalogue of figures: what each one is, its unit, what it is compared with and the target
//! it should reach. A run fills a [`Sample`] per figure; the report aggregates them.

use std::collections::BTreeMap;

use super::stats::Target;

/// Which kind of room a transfer went through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Room {
    /// Unencrypted: the media is the file.
    Plain,
    /// End-to-end encrypted: the media is the encrypted blob.
    Encrypted,
}

impl Room {
    /// `plain` or `encrypted`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::Encrypted => "encrypted",
        }
    }
}

/// One leg of the surface's own latency (its `mxbridge_latency` log lines).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Leg {
    /// From the `/sync` response in matrix-sdk's hands to the turn sent to the agent.
    SyncToAgent,
    /// Of [`Leg::SyncToAgent`], the part inside matrix-sdk before the surface's code sees the
    /// events (parsing, decryption, the SDK's stores).
    SdkSync,
    /// Of [`Leg::SdkSync`], the crypto machine's share (`receive_sync_changes`: to-device
    /// events, one-time key counts, device lists, the crypto store's two transactions).
    SdkCrypto,
    /// Of [`Leg::SdkSync`], saving the state store (`save_and_apply`: one transaction).
    SdkState,
    /// Of [`Leg::SyncToAgent`], the part after matrix-sdk hands the events over: the surface's
    /// own (its journal's commit, the lane, the frame to the agent).
    SurfaceSync,
    /// Of [`Leg::SurfaceSync`], until the journal has committed the events (reading the room's
    /// facts, classifying, the transaction and its fsync).
    SurfaceJournal,
    /// Of [`Leg::SurfaceSync`], from the journal's commit to the frame at the agent (waking the
    /// chat's lane, the turn, the agent link's socket).
    SurfaceLane,
    /// From the agent's message to the Matrix send.
    AgentToSend,
}

impl Leg {
    /// The `leg` field's value in the log.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SyncToAgent => "sync_to_agent",
            Self::SdkSync => "sdk_sync",
            Self::SdkCrypto => "sdk_crypto",
            Self::SdkState => "sdk_state",
            Self::SurfaceSync => "surface_sync",
            Self::SurfaceJournal => "surface_journal",
            Self::SurfaceLane => "surface_lane",
            Self::AgentToSend => "agent_to_send",
        }
    }

    /// Every leg, in table order.
    pub const ALL: [Leg; 8] = [
        Leg::SyncToAgent,
        Leg::SdkSync,
        Leg::SdkCrypto,
        Leg::SdkState,
        Leg::SurfaceSync,
        Leg::SurfaceJournal,
        Leg::SurfaceLane,
        Leg::AgentToSend,
    ];
    /// The legs that add up to the surface's time (the others are parts of them).
    pub const WHOLE: [Leg; 2] = [Leg::SyncToAgent, Leg::AgentToSend];
}

/// Which statistic of a series of samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stat {
    /// Median.
    P50,
    /// 99th percentile (nearest rank: the max for fewer than 51 samples).
    P99,
    /// Largest.
    Max,
}

impl Stat {
    /// `p50`, `p99` or `max`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::P50 => "p50",
            Self::P99 => "p99",
            Self::Max => "max",
        }
    }

    /// The percentile it stands for.
    pub fn p(self) -> f64 {
        match self {
            Self::P50 => 0.5,
            Self::P99 => 0.99,
            Self::Max => 1.0,
        }
    }
}

/// One figure of the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fig {
    /// SHA-256 over an in-memory buffer, MiB/s.
    Sha,
    /// 4 KiB write + fsync, per second.
    Fsync,
    /// The slowest of those fsyncs but 1 %, ms (comparator: the median).
    FsyncP99,
    /// Sequential write with a final fsync, MiB/s (comparator: without).
    SeqWrite,
    /// User → bot inbox, MiB/s, from the download's start (comparator: curl download's body).
    Inbound(Room),
    /// From the user's send returning to the surface starting the download, ms.
    InboundNotice(Room),
    /// Cores the surface kept busy during the inbound transfer (comparator: Synapse's).
    InboundCpu(Room),
    /// Cores the whole machine kept busy during the inbound transfer (comparator: its cores).
    InboundMachine(Room),
    /// Cores Synapse kept busy serving curl's download (the comparator of [`Fig::InboundCpu`]
    /// is its cores while serving the surface's), next to serving curl's download to
    /// `/dev/null`.
    InboundSynapseCurl(Room),
    /// How often per second Synapse's threads were preempted while serving the surface's download
    /// (comparator: while serving curl's).
    InboundSynapsePreempted(Room),
    /// The same, next to curl download + fsync.
    InboundFsync(Room),
    /// The same, next to curl downloading to `/dev/null`: the reader that keeps nothing, so how
    /// fast Synapse serves a reader that does less than curl writing a file.
    InboundNull(Room),
    /// The surface's peak RSS growth during the inbound transfer, MiB (comparator: curl's peak).
    InboundRss(Room),
    /// Agent → room, MiB/s: the surface's upload, as its log times it (comparator: curl upload).
    Outbound(Room),
    /// From the user's `send` message to the file event in the room, s.
    OutboundTotal(Room),
    /// Cores the surface kept busy from the `send` message to the file event (comparator:
    /// Synapse's).
    OutboundCpu(Room),
    /// Cores the whole machine kept busy over the same time (comparator: its cores).
    OutboundMachine(Room),
    /// MiB uploaded when the same file is sent again (comparator: the file's size).
    OutboundAgainBytes(Room),
    /// Seconds the second send of the same file took (comparator: the first send).
    OutboundAgainTime(Room),
    /// The surface's peak RSS growth during the outbound transfer, MiB (comparator: curl's
    /// peak uploading the same file).
    OutboundRss(Room),
    /// Surface-added latency, ms.
    Surface(Leg, Stat),
    /// Reply latency in an encrypted DM, ms (comparator: the echo bot).
    Reply {
        /// With a pause before each message (else back to back).
        paced: bool,
        /// p50 or p99.
        stat: Stat,
    },
    /// Messages answered per second in one room (comparator: the echo bot).
    OneRoom,
    /// Messages answered per second over `--rooms` rooms.
    Rooms,
    /// Of the one-room burst's time, the share the user spent sending, % (comparator: the echo
    /// bot's burst): near 100 means the homeserver's send rate, not the bot, set the pace.
    OneRoomSending,
    /// The same for the many-rooms burst.
    RoomsSending,
    /// Of the one-room burst, the bot's read receipts and typing notices per message
    /// (comparator: the echo bot, which sends none): requests besides the answers.
    OneRoomProgress,
    /// The same for the many-rooms burst.
    RoomsProgress,
    /// Preparing a 12-megapixel JPEG for a vision model, ms of the whole process (comparator:
    /// ImageMagick's `convert -resize` of the same file).
    ImagePrep,
    /// Its peak RSS growth over where the process stood before, MiB (comparator: ImageMagick's
    /// whole peak).
    ImagePrepRss,
    /// The bridge's own time on a voice message's way from the `/sync` response to the
    /// transcript in the agent, the transcription server's exchange subtracted, ms (comparator:
    /// that exchange).
    VoiceOverhead(Stat),
    /// A message's admission to its `ack` with the agent's state in PostgreSQL, one agent, ms
    /// (comparator: the file store): `paced`, every chat sending at a fixed rate that leaves the
    /// machine half idle (what a message meets in service); otherwise back to back, every chat
    /// sending its next message as soon as the previous one is answered (the machine saturated:
    /// the wait is mostly for a core).
    StateAdmit { paced: bool, stat: Stat },
    /// Turns per second with the state in PostgreSQL, one agent (comparator: the file store).
    StateTurns,
    /// Turns per second with the state in PostgreSQL, one agent held to 1/8 core (comparator:
    /// the file store, one agent held to the same).
    StateTurnsLimited,
    /// Turns per second with three agents on PostgreSQL (comparator: one agent).
    StateTurnsThree,
    /// The ACP brain's time from a message to the ACP agent reading `session/prompt`, ms
    /// (comparator: the builtin brain's whole path, message to its first text).
    AcpIn(Stat),
    /// Its time from the ACP agent writing its first chunk to that chunk reaching the surface,
    /// ms (comparator: the same builtin path).
    AcpOut(Stat),
}

/// How a figure reads in the report.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// Stable key for the JSON.
    pub key: String,
    /// Human label for the table.
    pub label: String,
    /// Unit of this figure and of its comparator.
    pub unit: &'static str,
    /// What it is compared with (empty: nothing, the figure stands alone).
    pub comparator: &'static str,
    /// What it should reach.
    pub target: Option<Target>,
    /// Whether `this / comparator` means something (not for RSS growth next to curl's peak).
    pub ratio: bool,
}

/// Largest surface RSS growth per transfer direction.
pub const RSS_LIMIT_MIB: f64 = 16.0;
/// Largest surface-added p99 per leg.
pub const LEG_P99_LIMIT_MS: f64 = 5.0;

impl Fig {
    /// Every figure in table order; `rooms` is `--rooms`.
    pub fn all() -> Vec<Fig> {
        let mut out = vec![Fig::Sha, Fig::Fsync, Fig::FsyncP99, Fig::SeqWrite];
        for room in [Room::Plain, Room::Encrypted] {
            out.extend([
                Fig::Inbound(room),
                Fig::InboundFsync(room),
                Fig::InboundNull(room),
                Fig::InboundNotice(room),
                Fig::InboundCpu(room),
                Fig::InboundMachine(room),
                Fig::InboundSynapseCurl(room),
                Fig::InboundSynapsePreempted(room),
                Fig::InboundRss(room),
            ]);
        }
        for room in [Room::Plain, Room::Encrypted] {
            out.extend([
                Fig::Outbound(room),
                Fig::OutboundTotal(room),
                Fig::OutboundCpu(room),
                Fig::OutboundMachine(room),
                Fig::OutboundAgainBytes(room),
                Fig::OutboundAgainTime(room),
                Fig::OutboundRss(room),
            ]);
        }
        for leg in Leg::ALL {
            for stat in [Stat::P50, Stat::P99, Stat::Max] {
                out.push(Fig::Surface(leg, stat));
            }
        }
        for paced in [false, true] {
            for stat in [Stat::P50, Stat::P99] {
                out.push(Fig::Reply { paced, stat });
            }
        }
        out.extend([
            Fig::OneRoom,
            Fig::OneRoomSending,
            Fig::OneRoomProgress,
            Fig::Rooms,
            Fig::RoomsSending,
            Fig::RoomsProgress,
            Fig::ImagePrep,
            Fig::ImagePrepRss,
            Fig::VoiceOverhead(Stat::P50),
            Fig::VoiceOverhead(Stat::P99),
            Fig::StateAdmit {
                paced: false,
                stat: Stat::P50,
            },
            Fig::StateAdmit {
                paced: false,
                stat: Stat::P99,
            },
            Fig::StateAdmit {
                paced: true,
                stat: Stat::P50,
            },
            Fig::StateAdmit {
                paced: true,
                stat: Stat::P99,
            },
            Fig::StateTurns,
            Fig::StateTurnsLimited,
            Fig::StateTurnsThree,
            Fig::AcpIn(Stat::P50),
            Fig::AcpIn(Stat::P99),
            Fig::AcpOut(Stat::P50),
            Fig::AcpOut(Stat::P99),
        ]);
        out
    }

    /// Label, unit, comparator and target; `rooms` is `--rooms`.
    pub fn spec(self, rooms: usize) -> Spec {
        let s = |key: String, label: String, unit, comparator, target| Spec {
            key,
            label,
            unit,
            comparator,
            target,
            ratio: !matches!(
                self,
                Fig::InboundRss(_)
                    | Fig::OutboundRss(_)
                    | Fig::ImagePrepRss
                    | Fig::VoiceOverhead(_)
                    | Fig::InboundCpu(_)
                    | Fig::InboundSynapseCurl(_)
                    | Fig::InboundSynapsePreempted(_)
                    | Fig::OutboundCpu(_)
                    | Fig::OneRoomSending
                    | Fig::RoomsSending
                    | Fig::OneRoomProgress
                    | Fig::RoomsProgress
            ),
        };
        let rss = Some(Target::AtMost(RSS_LIMIT_MIB));
        match self {
            Fig::Sha => s("sha256".into(), "SHA-256".into(), "MiB/s", "", None),
            Fig::Fsync => s("fsync".into(), "4 KiB write+fsync".into(), "/s", "", None),
            Fig::FsyncP99 => s("fsync_p99".into(), "fsync p99".into(), "ms", "p50", None),
            Fig::SeqWrite => s(
                "seq_write_fsync".into(),
                "seq. write+fsync".into(),
                "MiB/s",
                "no fsync",
                None,
            ),
            Fig::Inbound(r) => s(
                format!("inbound_{}", r.as_str()),
                format!("inbound {}", r.as_str()),
                "MiB/s",
                "curl",
                Some(Target::RatioAtLeast(0.9)),
            ),
            Fig::InboundFsync(r) => s(
                format!("inbound_{}_vs_fsync", r.as_str()),
                format!("inbound {}", r.as_str()),
                "MiB/s",
                "curl+fsync",
                None,
            ),
            Fig::InboundNull(r) => s(
                format!("inbound_{}_vs_null", r.as_str()),
                format!("inbound {}", r.as_str()),
                "MiB/s",
                "curl→null",
                None,
            ),
            Fig::InboundNotice(r) => s(
                format!("inbound_{}_until_download_ms", r.as_str()),
                format!("inbound {}: until download", r.as_str()),
                "ms",
                "",
                None,
            ),
            Fig::InboundCpu(r) => s(
                format!("inbound_{}_cores_busy", r.as_str()),
                format!("inbound {}: cores busy", r.as_str()),
                "cores",
                "Synapse",
                None,
            ),
            Fig::InboundMachine(r) => s(
                format!("inbound_{}_machine_busy", r.as_str()),
                format!("inbound {}: machine busy", r.as_str()),
                "cores",
                "cores",
                None,
            ),
            Fig::InboundSynapseCurl(r) => s(
                format!("inbound_{}_synapse_cores_for_curl", r.as_str()),
                format!("inbound {}: Synapse for curl", r.as_str()),
                "cores",
                "for curl→null",
                None,
            ),
            Fig::InboundSynapsePreempted(r) => s(
                format!("inbound_{}_synapse_preempted_per_s", r.as_str()),
                format!("inbound {}: Synapse preempted", r.as_str()),
                "/s",
                "for curl",
                None,
            ),
            Fig::InboundRss(r) => s(
                format!("inbound_{}_rss_growth", r.as_str()),
                format!("inbound {} RSS growth", r.as_str()),
                "MiB",
                "curl peak RSS",
                rss,
            ),
            Fig::Outbound(r) => s(
                format!("outbound_{}", r.as_str()),
                format!("outbound {}", r.as_str()),
                "MiB/s",
                "curl upload",
                Some(Target::RatioAtLeast(0.9)),
            ),
            Fig::OutboundTotal(r) => s(
                format!("outbound_{}_message_to_file_s", r.as_str()),
                format!("outbound {}: message to file", r.as_str()),
                "s",
                "",
                None,
            ),
            Fig::OutboundCpu(r) => s(
                format!("outbound_{}_cores_busy", r.as_str()),
                format!("outbound {}: cores busy", r.as_str()),
                "cores",
                "Synapse",
                None,
            ),
            Fig::OutboundMachine(r) => s(
                format!("outbound_{}_machine_busy", r.as_str()),
                format!("outbound {}: machine busy", r.as_str()),
                "cores",
                "cores",
                None,
            ),
            Fig::OutboundAgainBytes(r) => s(
                format!("outbound_{}_again_uploaded", r.as_str()),
                format!("outbound {} again: uploaded", r.as_str()),
                "MiB",
                "file size",
                Some(Target::AtMost(0.0)),
            ),
            Fig::OutboundAgainTime(r) => s(
                format!("outbound_{}_again_time", r.as_str()),
                format!("outbound {} again: time", r.as_str()),
                "s",
                "first send",
                None,
            ),
            Fig::OutboundRss(r) => s(
                format!("outbound_{}_rss_growth", r.as_str()),
                format!("outbound {} RSS growth", r.as_str()),
                "MiB",
                "curl peak RSS",
                rss,
            ),
            Fig::Surface(leg, stat) => s(
                format!("surface_{}_{}", leg.as_str(), stat.as_str()),
                format!("surface {} {}", leg.as_str(), stat.as_str()),
                "ms",
                "",
                (stat == Stat::P99 && Leg::WHOLE.contains(&leg))
                    .then_some(Target::AtMost(LEG_P99_LIMIT_MS)),
            ),
            Fig::Reply { paced, stat } => {
                let how = if paced { "paced" } else { "back_to_back" };
                s(
                    format!("reply_{how}_{}", stat.as_str()),
                    format!("reply {} {}", how.replace('_', "-"), stat.as_str()),
                    "ms",
                    "echo bot",
                    (!paced && stat == Stat::P50).then_some(Target::RatioAtMost(1.2)),
                )
            }
            Fig::OneRoom => s(
                "throughput_one_room".into(),
                "throughput 1 room".into(),
                "msg/s",
                "echo bot",
                Some(Target::RatioAtLeast(0.8)),
            ),
            Fig::Rooms => s(
                "throughput_rooms".into(),
                format!("throughput {rooms} rooms"),
                "msg/s",
                "echo bot",
                Some(Target::RatioAtLeast(0.8)),
            ),
            Fig::OneRoomSending => s(
                "throughput_one_room_sending_share".into(),
                "  of which sending".into(),
                "%",
                "echo bot",
                None,
            ),
            Fig::RoomsSending => s(
                "throughput_rooms_sending_share".into(),
                "  of which sending".into(),
                "%",
                "echo bot",
                None,
            ),
            Fig::OneRoomProgress => s(
                "throughput_one_room_progress_requests_per_message".into(),
                "  receipts+typing".into(),
                "/msg",
                "echo bot",
                None,
            ),
            Fig::RoomsProgress => s(
                "throughput_rooms_progress_requests_per_message".into(),
                "  receipts+typing".into(),
                "/msg",
                "echo bot",
                None,
            ),
            Fig::ImagePrep => s(
                "image_prep_12mp_ms".into(),
                "picture for a model".into(),
                "ms",
                "convert -resize",
                Some(Target::RatioAtMost(1.0)),
            ),
            Fig::StateAdmit { paced, stat } => s(
                format!(
                    "state_admit_{}{}_ms",
                    if paced { "paced_" } else { "" },
                    stat.as_str()
                ),
                format!(
                    "admission to ack {} {} (PostgreSQL)",
                    if paced { "paced" } else { "back-to-back" },
                    stat.as_str()
                ),
                "ms",
                "file store",
                (paced && stat == Stat::P99).then_some(Target::AtMost(5.0)),
            ),
            Fig::StateTurns => s(
                "state_turns_pg".into(),
                "turns, PostgreSQL, 1 agent".into(),
                "/s",
                "file store",
                Some(Target::RatioAtLeast(0.8)),
            ),
            Fig::StateTurnsLimited => s(
                "state_turns_pg_agent_bound".into(),
                "turns, PostgreSQL, 1 agent, 1/8 core".into(),
                "/s",
                "file store, 1 agent, 1/8 core",
                Some(Target::RatioAtLeast(0.8)),
            ),
            Fig::AcpIn(stat) => s(
                format!("acp_in_{}_ms", stat.as_str()),
                format!("message to ACP prompt {}", stat.as_str()),
                "ms",
                "builtin brain path",
                (stat == Stat::P99).then_some(Target::WithinOf(10.0)),
            ),
            Fig::AcpOut(stat) => s(
                format!("acp_out_{}_ms", stat.as_str()),
                format!("ACP chunk to surface {}", stat.as_str()),
                "ms",
                "builtin brain path",
                (stat == Stat::P99).then_some(Target::WithinOf(10.0)),
            ),
            Fig::StateTurnsThree => s(
                "state_turns_pg_3_agents".into(),
                "turns, PostgreSQL, 3 agents, 1/8 core each".into(),
                "/s",
                "1 agent, 1/8 core",
                Some(Target::RatioAtLeast(2.5)),
            ),
            Fig::VoiceOverhead(stat) => s(
                format!("voice_overhead_{}_ms", stat.as_str()),
                format!("voice to transcript {}", stat.as_str()),
                "ms",
                "transcription server",
                (stat == Stat::P50).then_some(Target::AtMost(20.0)),
            ),
            Fig::ImagePrepRss => s(
                "image_prep_12mp_rss_growth_mib".into(),
                "  peak RSS growth".into(),
                "MiB",
                "convert peak RSS",
                Some(Target::AtMost(64.0)),
            ),
        }
    }
}

/// One figure of one run: this project's value and its comparator's, measured in the same run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    /// This project (or the machine, for machine figures).
    pub this: Option<f64>,
    /// The comparator.
    pub other: Option<f64>,
}

impl Sample {
    /// Both values.
    pub fn new(this: f64, other: f64) -> Self {
        Self {
            this: Some(this),
            other: Some(other),
        }
    }

    /// A figure without a comparator.
    pub fn alone(this: f64) -> Self {
        Self {
            this: Some(this),
            other: None,
        }
    }
}

/// Everything one run measured.
pub type RunFigures = BTreeMap<Fig, Sample>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_unique_and_every_target_has_what_it_needs() {
        let all = Fig::all();
        let keys: std::collections::BTreeSet<String> = all.iter().map(|f| f.spec(20).key).collect();
        assert_eq!(keys.len(), all.len(), "duplicate keys");
        for f in all {
            let spec = f.spec(20);
            if matches!(
                spec.target,
                Some(Target::RatioAtLeast(_) | Target::RatioAtMost(_))
            ) {
                assert!(!spec.comparator.is_empty(), "{f:?} needs a comparator");
            }
        }
        assert_eq!(Fig::Rooms.spec(7).label, "throughput 7 rooms");
    }
}
