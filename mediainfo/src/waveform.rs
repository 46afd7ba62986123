//! Waveforms (MSC3246): the loudness of [`WAVEFORM_LEN`] equal slices of a recording.

use std::io::Read;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use crate::ogg::PacketReader;
use crate::{MediaError, WAVEFORM_LEN};

/// Largest waveform value (MSC3246 allows `0..=1024`).
const WAVEFORM_MAX: f64 = 1024.0;

/// Sums of squares per slice, turned into normalised RMS values at the end.
pub(crate) struct Slices {
    sum_sq: [f64; WAVEFORM_LEN],
    count: [u64; WAVEFORM_LEN],
}

impl Slices {
    pub(crate) fn new() -> Self {
        Slices {
            sum_sq: [0.0; WAVEFORM_LEN],
            count: [0; WAVEFORM_LEN],
        }
    }

    /// Counts one sample (full scale is ±1.0) towards `slice`; out-of-range slices and
    /// non-finite samples are ignored.
    pub(crate) fn add(&mut self, slice: usize, sample: f32) {
        if let (Some(sum), Some(count)) = (self.sum_sq.get_mut(slice), self.count.get_mut(slice))
            && sample.is_finite()
        {
            *sum += f64::from(sample) * f64::from(sample);
            *count += 1;
        }
    }

    /// RMS per slice, scaled so the loudest is 1024 (a quiet voice note still shows its
    /// shape, as in Element). Silence gives zeros; no sample at all gives `None`.
    pub(crate) fn finish(self) -> Option<Vec<u16>> {
        if self.count.iter().all(|&c| c == 0) {
            return None;
        }
        let rms: Vec<f64> = self
            .sum_sq
            .iter()
            .zip(self.count)
            .map(|(&sum, count)| {
                if count == 0 {
                    0.0
                } else {
                    (sum / count as f64).sqrt()
                }
            })
            .collect();
        let loudest = rms.iter().copied().fold(0.0, f64::max);
        Some(
            rms.iter()
                .map(|&r| {
                    if loudest > 0.0 {
                        // In 0..=1024 by construction; the cast cannot truncate.
                        (r / loudest * WAVEFORM_MAX)
                            .round()
                            .clamp(0.0, WAVEFORM_MAX) as u16
                    } else {
                        0
                    }
                })
                .collect(),
        )
    }
}

/// Decodes an Ogg/Opus stream (reader at its start) to mono at `rate` and measures each
/// slice of `duration`. Packets the decoder refuses are skipped; `None` if nothing decoded.
///
/// The decoder is a young crate fed with untrusted packets: a panic inside it is caught and
/// costs the waveform only, never the caller's task.
pub(crate) fn opus<R: Read>(
    reader: R,
    pre_skip: u16,
    duration: Duration,
    rate: u32,
) -> Result<Option<Vec<u16>>, MediaError> {
    let total = duration.as_nanos() * u128::from(rate) / 1_000_000_000;
    let Ok(total) = u64::try_from(total) else {
        return Ok(None);
    };
    if total == 0 {
        return Ok(None);
    }
    let Ok(mut decoder) = opus_pure::OpusDecoder::new(i32::try_from(rate).unwrap_or(0), 1) else {
        return Ok(None);
    };
    // 120 ms, the longest packet, at the output rate.
    let mut pcm = vec![0i16; rate as usize * 120 / 1000];
    let mut skip = u64::from(pre_skip) * u64::from(rate) / 48_000;
    let mut position = 0u64;
    let mut slices = Slices::new();
    let mut packets = PacketReader::new(reader);
    // The first two packets are the OpusHead and OpusTags headers.
    for _ in 0..2 {
        if packets.next_packet()?.is_none() {
            return Ok(None);
        }
    }
    while let Some(packet) = packets.next_packet()? {
        let max = pcm.len();
        let decoded = catch_unwind(AssertUnwindSafe(|| {
            decoder.decode_s16(packet, max, &mut pcm)
        }));
        let samples = match decoded {
            Ok(Ok(samples)) => samples.min(pcm.len()),
            Ok(Err(_)) => continue,
            Err(_panic) => return Ok(None),
        };
        for &sample in &pcm[..samples] {
            if skip > 0 {
                skip -= 1;
                continue;
            }
            let slice = position.saturating_mul(WAVEFORM_LEN as u64) / total;
            if slice >= WAVEFORM_LEN as u64 {
                return Ok(slices.finish());
            }
            slices.add(slice as usize, f32::from(sample) / 32_768.0);
            position += 1;
        }
    }
    Ok(slices.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_normalise_to_the_loudest() {
        let mut slices = Slices::new();
        for i in 0..WAVEFORM_LEN {
            slices.add(i, if i == 7 { 0.5 } else { 0.25 });
        }
        slices.add(3, f32::NAN);
        slices.add(WAVEFORM_LEN, 1.0);
        let wave = slices.finish().expect("samples were added");
        assert_eq!(wave.len(), WAVEFORM_LEN);
        assert_eq!(wave[7], 1024);
        assert_eq!(wave[0], 512);
    }

    #[test]
    fn silence_is_flat_and_nothing_is_none() {
        assert_eq!(Slices::new().finish(), None);
        let mut slices = Slices::new();
        slices.add(0, 0.0);
        assert_eq!(slices.finish(), Some(vec![0; WAVEFORM_LEN]));
    }
}
