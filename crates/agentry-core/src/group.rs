//! Group chat, the pure part: who an `@mention` names, which members each round wakes, and
//! what a member is shown when it is woken.
//!
//! A group is several saved agents (members) in one conversation. A user message wakes the
//! members it mentions (`@nickname`, `@id`, case-insensitive; `@all`), or every member when it
//! mentions none. Mentions in the members' replies start further rounds, up to a limit; a
//! member that spoke in a round is never woken by the very next one (it cannot wake itself,
//! nor be pulled back in straight after speaking). Each member sees the conversation from its
//! own point of view: its own replies as its assistant messages, everything else as user
//! messages labelled with the speaker ([`render_pending`]).
//!
//! Mentions are parsed so that what only looks like one is not: an `@` preceded by a letter,
//! digit or `_ . - + @` (e-mail addresses, `user@host`) is no mention, nor is anything inside
//! a code span or fenced code block. A mention must be followed by a boundary (not a letter,
//! digit, `_` or `-`, nor a `.` that continues a word), so `@bob.` and `@bob,` name bob while
//! `@bobby` and `@bob-smith` do not. Only members are matched, so a stray `@property` is
//! nothing.

use std::collections::BTreeSet;

/// The default number of rounds one user message may lead to.
pub const DEFAULT_MAX_ROUNDS: u32 = 5;

/// A member of a group, as mentions see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The saved agent's id.
    pub id: String,
    /// Its display name, if it has one.
    pub nickname: Option<String>,
}

impl Member {
    /// A member with an id and an optional nickname.
    pub fn new(id: impl Into<String>, nickname: Option<String>) -> Self {
        Self {
            id: id.into(),
            nickname,
        }
    }

    /// The name others see: the nickname, else the id.
    pub fn display_name(&self) -> &str {
        self.nickname.as_deref().unwrap_or(&self.id)
    }
}

/// Who a text mentions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mentions {
    /// Whether it says `@all`.
    pub all: bool,
    /// The members it names, by id, in the group's order, each once.
    pub ids: Vec<String>,
}

impl Mentions {
    /// Whether nobody is mentioned.
    pub fn is_empty(&self) -> bool {
        !self.all && self.ids.is_empty()
    }

    /// The members mentioned, by id, in the group's order (`@all`: every member).
    pub fn members(&self, members: &[Member]) -> Vec<String> {
        if self.all {
            members.iter().map(|m| m.id.clone()).collect()
        } else {
            self.ids.clone()
        }
    }
}

/// Characters that continue a name: a mention must not be followed by one.
fn is_name_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '-'
}

/// Characters that, right before an `@`, make it part of a word (an e-mail address, `a@b`).
fn joins_at(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '.' | '-' | '+' | '@' | '/' | '\\')
}

/// Whether `rest` starts with `name`, ignoring case; returns the length in bytes matched.
fn starts_with_ignore_case(rest: &str, name: &str) -> Option<usize> {
    let mut rest_chars = rest.char_indices();
    for expected in name.chars() {
        let (_, got) = rest_chars.next()?;
        if !got.to_lowercase().eq(expected.to_lowercase()) {
            return None;
        }
    }
    Some(rest_chars.next().map_or(rest.len(), |(index, _)| index))
}

/// Whether the text after a candidate mention ends it: end of text, or a character that does
/// not continue a name (a `.` continues one only when a name character follows it).
fn ends_mention(after: &str) -> bool {
    let mut chars = after.chars();
    match chars.next() {
        None => true,
        Some('.') => !chars.next().is_some_and(is_name_char),
        Some(c) => !is_name_char(c),
    }
}

/// The byte ranges of `text` that are code: fenced blocks and inline spans (a run of N
/// backticks closed by the next run of exactly N; an unclosed run is literal text).
fn code_ranges(text: &str) -> Vec<(usize, usize)> {
    let bytes = text.as_bytes();
    let mut ranges = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'`' {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && bytes[i] == b'`' {
            i += 1;
        }
        let width = i - start;
        // Find the closing run of exactly `width` backticks.
        let mut j = i;
        let mut closed = None;
        while j < bytes.len() {
            if bytes[j] == b'`' {
                let run_start = j;
                while j < bytes.len() && bytes[j] == b'`' {
                    j += 1;
                }
                if j - run_start == width {
                    closed = Some(j);
                    break;
                }
            } else {
                j += 1;
            }
        }
        match closed {
            Some(end) => {
                ranges.push((start, end));
                i = end;
            }
            None => {
                // A fence left open (a reply cut off mid-block) runs to the end.
                if width >= 3 {
                    ranges.push((start, bytes.len()));
                    break;
                }
            }
        }
    }
    ranges
}

/// Who `text` mentions among `members`: `@all`, ids and nicknames, case-insensitive, the
/// longest name matching at each `@`. E-mail addresses and code are not mentions.
pub fn mentions(text: &str, members: &[Member]) -> Mentions {
    let code = code_ranges(text);
    let in_code = |at: usize| code.iter().any(|(start, end)| at >= *start && at < *end);
    let mut all = false;
    let mut found: BTreeSet<usize> = BTreeSet::new();
    for (at, c) in text.char_indices() {
        if c != '@' || in_code(at) {
            continue;
        }
        if text[..at].chars().next_back().is_some_and(joins_at) {
            continue;
        }
        let rest = &text[at + 1..];
        // The longest name that matches here wins (`@Code Reviewer` over `@Code`).
        let mut best: Option<(usize, Option<usize>)> = None;
        let mut consider = |name: &str, member: Option<usize>| {
            if name.is_empty() {
                return;
            }
            if let Some(len) = starts_with_ignore_case(rest, name)
                && ends_mention(&rest[len..])
                && best.is_none_or(|(best_len, _)| len > best_len)
            {
                best = Some((len, member));
            }
        };
        consider("all", None);
        for (index, member) in members.iter().enumerate() {
            consider(&member.id, Some(index));
            if let Some(nickname) = &member.nickname {
                consider(nickname, Some(index));
            }
        }
        match best {
            Some((_, Some(index))) => {
                found.insert(index);
            }
            Some((_, None)) => all = true,
            None => {}
        }
    }
    Mentions {
        all,
        ids: found
            .into_iter()
            .filter_map(|index| members.get(index).map(|m| m.id.clone()))
            .collect(),
    }
}

/// The members the user's message wakes: those it mentions, or everyone when it mentions none.
pub fn first_round(text: &str, members: &[Member]) -> Vec<String> {
    let mentioned = mentions(text, members);
    if mentioned.is_empty() {
        members.iter().map(|m| m.id.clone()).collect()
    } else {
        mentioned.members(members)
    }
}

/// The members the replies of a round wake for the next one: those mentioned in any reply
/// (`(speaker id, text)`), in the group's order, except every member that spoke in that round
/// (nobody is woken twice in a row, and nobody wakes itself). Empty: the exchange is over.
pub fn next_round(replies: &[(String, String)], members: &[Member]) -> Vec<String> {
    let spoke: BTreeSet<&str> = replies.iter().map(|(id, _)| id.as_str()).collect();
    let mut woken: BTreeSet<String> = BTreeSet::new();
    for (_, text) in replies {
        woken.extend(mentions(text, members).members(members));
    }
    members
        .iter()
        .filter(|m| woken.contains(&m.id) && !spoke.contains(m.id.as_str()))
        .map(|m| m.id.clone())
        .collect()
}

/// Decides the rounds of one exchange: the first from the user's message, each next from the
/// replies of the last, until nobody is woken or `max_rounds` rounds have run.
#[derive(Debug, Clone)]
pub struct GroupRouter {
    members: Vec<Member>,
    max_rounds: u32,
    round: u32,
}

impl GroupRouter {
    /// A router over `members` allowing `max_rounds` rounds (at least 1).
    pub fn new(members: Vec<Member>, max_rounds: u32) -> Self {
        Self {
            members,
            max_rounds: max_rounds.max(1),
            round: 0,
        }
    }

    /// The rounds run so far.
    pub fn rounds(&self) -> u32 {
        self.round
    }

    /// The members.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// Round 1: the members the user's message wakes.
    pub fn start(&mut self, text: &str) -> (u32, Vec<String>) {
        self.round = 1;
        (1, first_round(text, &self.members))
    }

    /// After a round: the next round and whom it wakes, or why the exchange ends.
    pub fn after(&mut self, replies: &[(String, String)]) -> Result<(u32, Vec<String>), GroupEnd> {
        let woken = next_round(replies, &self.members);
        if woken.is_empty() {
            return Err(GroupEnd::Quiet);
        }
        if self.round >= self.max_rounds {
            return Err(GroupEnd::MaxRounds);
        }
        self.round += 1;
        Ok((self.round, woken))
    }
}

/// Why an exchange ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupEnd {
    /// Nobody was mentioned for another round.
    Quiet,
    /// Mentions asked for another round, but the round limit was reached.
    MaxRounds,
}

impl GroupEnd {
    /// The stable string form (`completed`, `max_rounds`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Quiet => "completed",
            Self::MaxRounds => "max_rounds",
        }
    }
}

/// One message of a group's transcript, as the member views are built from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TranscriptEntry {
    /// The exchange (user message) it belongs to, from 1.
    pub exchange: u32,
    /// The round, from 1; 0 for the user's message.
    pub round: u32,
    /// The member who said it; `None` for the user.
    pub speaker: Option<String>,
    /// The speaker's display name.
    pub name: String,
    /// What was said.
    pub text: String,
}

/// What member `id`, woken at round `round` of exchange `exchange`, has not seen yet: every
/// message of earlier rounds not its own, from the round of its previous turn on (`previous`:
/// the `(exchange, round)` it was last woken in, whether or not it answered; messages of that
/// round were said while it spoke). Members' replies in the current round are not shown.
pub fn pending_for<'a>(
    id: &str,
    transcript: &'a [TranscriptEntry],
    previous: Option<(u32, u32)>,
    exchange: u32,
    round: u32,
) -> Vec<&'a TranscriptEntry> {
    let now = (exchange, round);
    transcript
        .iter()
        .filter(|e| e.speaker.as_deref() != Some(id))
        .filter(|e| (e.exchange, e.round) < now)
        .filter(|e| previous.is_none_or(|prev| (e.exchange, e.round) >= prev))
        .collect()
}

/// The user turn a member is sent: each message it has not seen, labelled with its speaker
/// (`**name** (id): text` for members, `**name**: text` for the user).
pub fn render_pending(entries: &[&TranscriptEntry]) -> String {
    let mut out = String::new();
    for entry in entries {
        if !out.is_empty() {
            out.push_str("\n\n");
        }
        match &entry.speaker {
            Some(id) if *id != entry.name => {
                out.push_str(&format!("**{}** ({id}): {}", entry.name, entry.text));
            }
            _ => out.push_str(&format!("**{}**: {}", entry.name, entry.text)),
        }
    }
    out
}

/// The note appended to a member's system prompt: who it is, who else is in the group, and how
/// to address them.
pub fn group_prompt(me: &Member, members: &[Member]) -> String {
    let mut out = format!(
        "You are {} (id `{}`) in a group chat with the user and other agents. Messages from \
         others come labelled with the speaker's name. To ask a member to answer, mention them \
         with @name (or @all); mention nobody when you need no answer.\nMembers:",
        me.display_name(),
        me.id
    );
    for member in members.iter().filter(|m| m.id != me.id) {
        out.push_str(&format!(
            "\n- @{} (id `{}`)",
            member.display_name(),
            member.id
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn team() -> Vec<Member> {
        vec![
            Member::new("alice", Some("Alice".into())),
            Member::new("bob", None),
            Member::new("rev", Some("Code Reviewer".into())),
        ]
    }

    fn ids(text: &str) -> Vec<String> {
        mentions(text, &team()).ids
    }

    #[test]
    fn email_addresses_are_not_mentions() {
        assert!(ids("write to alice@example.com or bob@bob.org").is_empty());
        assert!(ids("ssh bob@host").is_empty());
        assert_eq!(ids("mail alice@example.com, then ask @bob"), vec!["bob"]);
    }

    #[test]
    fn all_mentions_everyone_case_insensitively() {
        let found = mentions("hey @ALL, ready?", &team());
        assert!(found.all);
        assert_eq!(found.members(&team()), vec!["alice", "bob", "rev"]);
        assert!(!mentions("me@all.com", &team()).all);
        assert!(!mentions("@allison", &team()).all);
    }

    #[test]
    fn names_match_ids_and_nicknames_ignoring_case() {
        assert_eq!(ids("@ALICE look"), vec!["alice"]);
        assert_eq!(ids("@Bob and @alice"), vec!["alice", "bob"]);
        assert_eq!(ids("@code reviewer please"), vec!["rev"]);
        assert_eq!(ids("@REV"), vec!["rev"]);
        assert!(ids("@bobby @bob-smith @carol").is_empty());
    }

    #[test]
    fn punctuation_after_a_mention_ends_it() {
        assert_eq!(ids("thanks @bob."), vec!["bob"]);
        assert_eq!(ids("(@bob), @alice!"), vec!["alice", "bob"]);
        assert_eq!(ids("@alice: @bob?"), vec!["alice", "bob"]);
        assert!(ids("@bob.smith").is_empty());
    }

    #[test]
    fn code_is_not_mentions() {
        assert!(ids("use `@bob` as a decorator").is_empty());
        assert!(ids("```python\n@alice\ndef f(): pass\n```").is_empty());
        assert_eq!(ids("``x ` @alice`` then @bob"), vec!["bob"]);
        assert_eq!(ids("a lone ` then @bob"), vec!["bob"]);
        assert!(ids("```\n@bob (cut off").is_empty());
    }

    #[test]
    fn mentions_are_listed_once_in_group_order() {
        assert_eq!(ids("@rev @bob @rev @Alice"), vec!["alice", "bob", "rev"]);
    }

    #[test]
    fn unicode_nicknames() {
        let members = vec![
            Member::new("zh", Some("小明".into())),
            Member::new("b", None),
        ];
        assert_eq!(mentions("请 @小明 看看", &members).ids, vec!["zh"]);
    }

    #[test]
    fn the_first_round_wakes_the_mentioned_or_everyone() {
        assert_eq!(first_round("@bob go", &team()), vec!["bob"]);
        assert_eq!(first_round("hello", &team()), vec!["alice", "bob", "rev"]);
        assert_eq!(first_round("@all go", &team()), vec!["alice", "bob", "rev"]);
    }

    #[test]
    fn nobody_is_woken_twice_in_a_row() {
        let replies = vec![
            ("alice".to_owned(), "@alice @bob thoughts?".to_owned()),
            ("bob".to_owned(), "@alice agreed".to_owned()),
        ];
        assert!(next_round(&replies, &team()).is_empty());
        let replies = vec![("alice".to_owned(), "@all over to you".to_owned())];
        assert_eq!(next_round(&replies, &team()), vec!["bob", "rev"]);
    }

    #[test]
    fn the_router_stops_at_the_round_limit() {
        let mut router = GroupRouter::new(team(), 2);
        assert_eq!(router.start("@alice"), (1, vec!["alice".to_owned()]));
        let (round, woken) = router
            .after(&[("alice".into(), "@bob".into())])
            .expect("round 2");
        assert_eq!((round, woken), (2, vec!["bob".to_owned()]));
        assert_eq!(
            router.after(&[("bob".into(), "@alice".into())]),
            Err(GroupEnd::MaxRounds)
        );
        let mut router = GroupRouter::new(team(), 5);
        router.start("hi");
        assert_eq!(
            router.after(&[("bob".into(), "done".into())]),
            Err(GroupEnd::Quiet)
        );
    }

    fn entry(exchange: u32, round: u32, speaker: Option<&str>, text: &str) -> TranscriptEntry {
        TranscriptEntry {
            exchange,
            round,
            speaker: speaker.map(str::to_owned),
            name: speaker.unwrap_or("user").to_owned(),
            text: text.to_owned(),
        }
    }

    #[test]
    fn a_member_sees_what_it_missed_and_not_its_own_words() {
        let transcript = vec![
            entry(1, 0, None, "hi all"),
            entry(1, 1, Some("alice"), "A1 @bob"),
            entry(1, 1, Some("bob"), "B1"),
            entry(1, 2, Some("bob"), "B2"),
            entry(2, 0, None, "again"),
        ];
        let texts = |id: &str, previous, exchange, round| -> Vec<String> {
            pending_for(id, &transcript, previous, exchange, round)
                .into_iter()
                .map(|e| e.text.clone())
                .collect()
        };
        // First turn: the user's message only (round-1 replies are concurrent).
        assert_eq!(texts("alice", None, 1, 1), vec!["hi all"]);
        // Bob in round 2 sees Alice's concurrent round-1 reply.
        assert_eq!(texts("bob", Some((1, 1)), 1, 2), vec!["A1 @bob"]);
        // Alice in exchange 2 sees Bob's round-1 and round-2 replies and the new message.
        assert_eq!(
            texts("alice", Some((1, 1)), 2, 1),
            vec!["B1", "B2", "again"]
        );
        // A member never woken sees everything; one woken without answering, what came since.
        assert_eq!(texts("rev", None, 2, 1).len(), 5);
        assert_eq!(texts("rev", Some((1, 2)), 2, 1), vec!["B2", "again"]);
        let rendered = render_pending(&pending_for("alice", &transcript, Some((1, 1)), 2, 1));
        assert_eq!(rendered, "**bob**: B1\n\n**bob**: B2\n\n**user**: again");
        let named = TranscriptEntry {
            name: "Alice".into(),
            ..entry(1, 1, Some("alice"), "x")
        };
        assert_eq!(render_pending(&[&named]), "**Alice** (alice): x");
    }
}
