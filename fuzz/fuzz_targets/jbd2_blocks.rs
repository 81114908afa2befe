//! Journal blocks: the journal superblock (and the parameters it yields), descriptor tags,
//! commit and revoke blocks, their checksums, escaping.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rext4_format::jbd2::{
    self, CommitBlock, CsumVersion, DescriptorTags, Header, JournalParams, JournalSuperblock, RevokeBlock,
};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, block)) = data.split_first() else { return };
    let mut padded = block.to_vec();
    padded.resize(padded.len().max(1024), 0);
    if let Some(jsb) = JournalSuperblock::parse(&padded) {
        let _ = (jsb.version(), jsb.is_v2(), jsb.block_size(), jsb.maxlen(), jsb.first());
        let _ = (jsb.sequence(), jsb.start(), jsb.errno(), jsb.head(), jsb.nr_users());
        let _ = (jsb.compat(), jsb.incompat(), jsb.ro_compat(), jsb.uuid(), jsb.checksum_type());
        let _ = (jsb.num_fc_blks(), jsb.fast_commit_blocks(), jsb.has_fast_commit());
        let _ = (jsb.csum_version(), jsb.is_64bit(), jsb.tag_size(), jsb.csum_seed());
        let _ = (jsb.compute_checksum(), jsb.verify_checksum());
        let _ = jsb.users().count();
        if let Ok(p) = jsb.params() {
            parse_blocks(&padded, &JournalParams { block_size: padded.len(), ..p });
        }
    }
    let csum = [CsumVersion::None, CsumVersion::V1, CsumVersion::V2, CsumVersion::V3][usize::from(sel & 3)];
    let params = JournalParams {
        block_size: block.len(),
        is_64bit: sel & 4 != 0,
        csum,
        csum_seed: jbd2::journal_csum_seed(&[sel; 16]),
    };
    parse_blocks(block, &params);
    if let Some(h) = Header::parse(block) {
        let _ = (h.has_magic(), h.block_type(), h.sequence());
    }
    let _ = jbd2::stored_tail_checksum(block);
    let _ = jbd2::verify_tail(block, &params);
    let mut copy = block.to_vec();
    jbd2::set_tail(&mut copy, &params);
    // Escaping restores the block as it was before it (on a block under 8 bytes the tail
    // overlaps the first four, so compare with the copy, not the input).
    let tailed = copy.clone();
    if jbd2::escape_block(&mut copy) {
        jbd2::unescape_block(&mut copy);
        assert_eq!(copy.get(..4), tailed.get(..4));
    }
});

fn parse_blocks(block: &[u8], params: &JournalParams) {
    if let Ok(d) = DescriptorTags::parse(block, params) {
        let _ = (d.header(), d.sequence(), d.verify_checksum());
        for t in d.take(block.len()) {
            let _ = (t.is_escaped(), t.is_last(), t.verify_data(params, 1, block));
        }
    }
    if let Ok(c) = CommitBlock::parse(block, params) {
        let _ = (c.sequence(), c.commit_time(), c.compute_checksum(), c.verify_checksum());
    }
    if let Ok(r) = RevokeBlock::parse(block, params) {
        let _ = (r.sequence(), r.len(), r.is_empty(), r.verify_checksum());
        assert_eq!(r.blocks().count(), r.len());
    }
}
