// Options of the commands the classifier labels `write` (or `delete`): a
// write in scope is allowed by the host's default rules without a prompt, so
// such a command must not be able to run a program. Default-deny, as the
// read-only list (./readonly.js, same table syntax): a command listed here is
// a write only when every option on its line is listed for it; any other
// option makes it `shell` (ask). Left out on purpose, because they run
// programs or reach past the named files:
//   tar   --to-command, --checkpoint-action, -I/--use-compress-program, -F/
//         --info-script/--new-volume-script, --rsh-command, --rmt-command,
//         -P/--absolute-names, -M, -g/--listed-incremental, --index-file
//   zip   -T/-TT (runs a test command), -m (deletes the inputs), -e/-P
//   split --filter;  install --strip-program;  setfacl --restore
//   rsync -e/--rsh, --rsync-path, --log-file, --write-batch, --read-batch,
//         --daemon, --config, --early-input
//   git   -c/--exec-path (global), rebase -x/--exec/-i, bisect, difftool,
//         mergetool, filter-branch, config (any key), worktree, merge -s,
//         commit -S/-e/-t (gpg, editor), tag -s/-u/-v, any unlisted subcommand
// GNU cp/mv/ln/touch/mkdir/chmod/chown/tee/truncate/rm have no option that
// runs a program; they keep their own positional handling in classify.js.
// `=W` marks an option whose argument is a place the command writes (tar's
// archive and -C folder, unzip -d, install -t, rsync's backup folder): the
// caller judges it as a write target in every spelling (`--file=X`, `-fX`).

import { checkArgs, parseSpec } from "./readonly.js";

const COMMON = "--help --version";

export const WRITE_SPECS = {
  tar: "-A -c -d -r -t -u -x --append --catenate --concatenate --create --diff --compare --delete --extract --get --list --update --test-label -f=W --file=W -C=W --directory=W -v --verbose -z --gzip --gunzip --ungzip -j --bzip2 -J --xz --lzma --zstd --lzip --lzop -Z --compress --uncompress -a --auto-compress -k --keep-old-files --skip-old-files --overwrite --overwrite-dir --no-overwrite-dir --keep-newer-files --keep-directory-symlink -U --unlink-first --recursive-unlink -p --preserve-permissions --same-permissions --no-same-permissions --same-owner --no-same-owner --numeric-owner --owner= --group= --mode= --mtime= --sort= --format= -H= -m --touch -O --to-stdout -h --dereference --hard-dereference --exclude= -X=R --exclude-from=R -T=R --files-from=R --null --no-null --strip-components= --transform= --xform= --wildcards --no-wildcards --wildcards-match-slash --anchored --no-anchored --ignore-case --no-ignore-case --no-recursion --recursion --one-file-system --exclude-vcs --exclude-vcs-ignores --exclude-caches --exclude-backups --totals? --warning= -W --verify -S --sparse -b= --blocking-factor= --record-size= -B --read-full-records -i --ignore-zeros --ignore-failed-read --checkpoint? --force-local --show-transformed-names --show-stored-names --full-time --utc --delay-directory-restore --no-delay-directory-restore --acls --no-acls --xattrs --no-xattrs --selinux --no-selinux -s --preserve-order --same-order -o --no-auto-compress --level= -N= --newer= --after-date= --newer-mtime= -l --check-links --check-device --no-check-device --occurrence? --blocks=",
  zip: "-0 -1 -2 -3 -4 -5 -6 -7 -8 -9 -r -R -q -v -j -u -f -d -D -X -y -l -k -o -g -z -S -x= -i= -n= -t= -tt= --recurse-paths --recurse-patterns --quiet --verbose --junk-paths --update --freshen --delete --no-dir-entries --no-extra --symlinks --exclude= --include= --suffixes= --grow --system-hidden --to-crlf --from-crlf --filesync --latest-time",
  unzip: "-l -t -v -z -T -p -c -f -u -o -n -q -qq -j -a -aa -b -C -L -LL -X -V -M -d=W -x= -O= -I=",
  gzip: "-c -d -f -k -l -n -N -q -r -t -v -1 -2 -3 -4 -5 -6 -7 -8 -9 -S= --stdout --to-stdout --decompress --uncompress --force --keep --list --no-name --name --quiet --recursive --test --verbose --fast --best --suffix= --rsyncable --synchronous",
  gunzip: "-c -f -k -l -n -N -q -r -t -v -S= --stdout --to-stdout --force --keep --list --no-name --name --quiet --recursive --test --verbose --suffix=",
  bzip2: "-c -d -z -f -k -q -s -t -v -1 -2 -3 -4 -5 -6 -7 -8 -9 --stdout --decompress --compress --force --keep --quiet --small --test --verbose --fast --best",
  xz: "-c -d -z -f -k -q -t -v -e -l -T= -0 -1 -2 -3 -4 -5 -6 -7 -8 -9 -F= -C= -S= --stdout --to-stdout --decompress --uncompress --compress --force --keep --quiet --test --verbose --extreme --list --threads= --format= --check= --suffix= --single-stream --no-sparse --fast --best --memlimit= --memory=",
  split: "-a= -b= -C= -d -l= -n= -t= -e -u -x --suffix-length= --additional-suffix= --bytes= --line-bytes= --lines= --number= --separator= --numeric-suffixes? --hex-suffixes? --elide-empty-files --unbuffered --verbose -NUM",
  install: "-b -C -c -d -D -g= -m= -o= -p -s -S= -t=W -T -v -Z --backup? --compare --directory --group= --mode= --owner= --preserve-timestamps --strip --suffix= --target-directory=W --no-target-directory --verbose --preserve-context --context?",
  setfacl: "-m= -M=R -x= -X=R -b -k -d -R -L -P -n --modify= --modify-file=R --remove= --remove-file=R --remove-all --remove-default --default --recursive --logical --physical --no-mask --mask --test --set= --set-file=R",
  rsync: "-a -r -v -q -z -c -u -l -L -k -K -H -p -E -A -X -o -g -D -t -O -J -n -W -x -h -i -P -S -R -b -d -m -y -8 -C -F -T=W -f= --archive --recursive --verbose --quiet --compress --checksum --update --links --copy-links --copy-dirlinks --keep-dirlinks --hard-links --perms --executability --acls --xattrs --owner --group --devices --specials --times --atimes --crtimes --omit-dir-times --omit-link-times --dry-run --whole-file --no-whole-file --one-file-system --human-readable --itemize-changes --progress --partial --sparse --relative --no-relative --no-implied-dirs --backup --dirs --prune-empty-dirs --fuzzy --delete --delete-before --delete-during --delete-delay --delete-after --delete-excluded --ignore-existing --existing --ignore-times --size-only --inplace --append --append-verify --stats --no-motd --exclude= --include= --filter= --exclude-from=R --include-from=R --files-from=R --from0 --max-size= --min-size= --bwlimit= --timeout= --contimeout= --chmod= --suffix= --backup-dir=W --info= --debug= --out-format= --safe-links --munge-links --mkpath --numeric-ids --cvs-exclude --remove-source-files --force --max-delete= --copy-unsafe-links --preallocate --list-only --8-bit-output --protect-args --no-recursive --no-perms --no-owner --no-group --no-times --no-links --delay-updates --temp-dir=W --partial-dir=W --compare-dest= --copy-dest= --link-dest= --modify-window= --checksum-choice= --compress-level= --skip-compress=",
};

// git subcommands that change the repository (or discard work) and the
// options each may carry; `positionals` is handled by classify.js.
export const GIT_WRITE_SPECS = {
  add: "-A -u -n -v -f -N --all --update --dry-run --verbose --force --intent-to-add --ignore-errors --ignore-missing --refresh --chmod= --renormalize --sparse --no-all --ignore-removal --no-ignore-removal --pathspec-from-file=R --pathspec-file-nul",
  commit: "-a -m= -q -v -s -n -o -i -u? -F=R -C= --all --message= --quiet --verbose --signoff --no-signoff --no-verify --verify --no-post-rewrite --only --include --amend --no-edit --allow-empty --allow-empty-message --author= --date= --file=R --reuse-message= --reset-author --no-gpg-sign --cleanup= --no-status --status --untracked-files? --dry-run --short --porcelain --long --pathspec-from-file=R --pathspec-file-nul --trailer=",
  checkout: "-b= -B= -f -q -m -t -l --quiet --force --merge --detach --track? --no-track --orphan= --ours --theirs --progress --no-progress --ignore-skip-worktree-bits --overwrite-ignore --no-overwrite-ignore --no-recurse-submodules --guess --no-guess --conflict=",
  switch: "-c= -C= -d -f -m -q -t --create= --force-create= --detach --discard-changes --force --merge --quiet --track? --no-track --orphan= --guess --no-guess --progress --no-progress --conflict= --no-recurse-submodules --ignore-other-worktrees",
  branch: "-a -c -C -d -D -f -l -m -M -q -r -t -u= -v -vv --all --copy --delete --force --list --move --quiet --remotes --track? --no-track --set-upstream-to= --unset-upstream --show-current --verbose --contains? --no-contains? --merged? --no-merged? --points-at= --sort= --format= --color? --no-color --column? --no-column --abbrev= --no-abbrev --ignore-case --create-reflog",
  tag: "-a -d -f -l -n= -m= -F=R --annotate --delete --force --list --message= --file=R --sort= --contains? --no-contains? --merged? --no-merged? --points-at= --format= --color? --column? --no-column --ignore-case --create-reflog --no-sign --cleanup=",
  stash: "-u -a -k -q -m= -S --include-untracked --all --keep-index --no-keep-index --quiet --message= --index --staged --pathspec-from-file=R --pathspec-file-nul",
  reset: "-q -N --soft --mixed --hard --merge --keep --quiet --intent-to-add --no-recurse-submodules --pathspec-from-file=R --pathspec-file-nul --no-refresh --refresh",
  restore: "-s= -S -W -q -m -2 -3 --source= --staged --worktree --quiet --merge --conflict= --ours --theirs --ignore-unmerged --ignore-skip-worktree-bits --overlay --no-overlay --no-recurse-submodules --progress --no-progress --pathspec-from-file=R --pathspec-file-nul",
  init: "-q -b= --bare --quiet --initial-branch= --object-format= --shared?",
  merge: "-m= -q -v -n -X= --no-edit --ff --no-ff --ff-only --squash --no-squash --commit --no-commit --message= --quiet --verbose --abort --continue --quit --stat --no-stat --log? --no-log --allow-unrelated-histories --no-verify --no-gpg-sign --progress --no-progress --autostash --no-autostash --strategy-option= --signoff --no-signoff",
  rebase: "-q -v -n -f -m -C= --continue --abort --skip --quit --onto= --keep-base --quiet --verbose --stat --no-stat --no-verify --verify --autostash --no-autostash --fork-point --no-fork-point --root --committer-date-is-author-date --reset-author-date --ignore-date --ignore-whitespace --whitespace= --force-rebase --no-ff --apply --merge --update-refs --no-update-refs --empty= --keep-empty --no-keep-empty --no-gpg-sign --signoff",
  "cherry-pick": "-n -x -s -m= -X= --no-commit --signoff --mainline= --continue --abort --skip --quit --ff --allow-empty --allow-empty-message --keep-redundant-commits --no-edit --no-gpg-sign --strategy-option= --cleanup= --empty=",
  revert: "-n -s -m= -X= --no-commit --signoff --mainline= --continue --abort --skip --quit --no-edit --no-gpg-sign --strategy-option= --cleanup= --reference",
  apply: "-3 -R -v -q -z -p= -C= --stat --numstat --summary --check --index --cached --intent-to-add --3way --reverse --reject --unidiff-zero --apply --no-add --exclude= --include= --ignore-space-change --ignore-whitespace --whitespace= --recount --directory= --verbose --quiet --allow-empty --allow-overlap --inaccurate-eof",
  am: "-3 -s -k -q --continue --abort --skip --quit --3way --signoff --keep --keep-cr --no-keep-cr --quiet --committer-date-is-author-date --ignore-date --ignore-whitespace --whitespace= --empty= --no-verify",
  clean: "-d -f -n -q -x -X -e= --dry-run --quiet --force --exclude=",
  rm: "-f -n -r -q --cached --force --dry-run --quiet --ignore-unmatch --sparse --pathspec-from-file=R --pathspec-file-nul",
  mv: "-f -k -n -v --force --dry-run --verbose",
  gc: "--aggressive --auto --quiet --prune? --no-prune --force --keep-largest-pack",
  reflog: "-n --all --expire= --expire-unreachable= --rewrite --updateref --stale-fix --dry-run --verbose --single-worktree",
  remote: "-f -t= -m= -v --tags --no-tags --mirror? --verbose --push --add --delete --all --dry-run",
  notes: "-m= -F=R -f -c= -C= --message= --file=R --force --ref= --allow-empty",
};

const PARSED = new Map();
for (const [name, text] of [...Object.entries(WRITE_SPECS), ...Object.entries(GIT_WRITE_SPECS).map(([k, v]) => [`git ${k}`, v])]) {
  PARSED.set(name, { o: text, pos: "paths", parsed: parseSpec(`${text} ${COMMON}`) });
}

/** `tar xzf a.tgz` (old style): the first word is a cluster whose letters take the next words in turn. */
function tarOldStyle(words, spec) {
  const first = words[1];
  if (!first || first.text.startsWith("-") || !/^[A-Za-z]+$/.test(first.text) || first.dynamic) return words;
  const out = [words[0]];
  let next = 2;
  for (const c of first.text) {
    const info = spec.parsed.short.get(c);
    out.push({ ...first, text: `-${c}` });
    if (info && info.arg) for (let k = 0; k < info.arg; k++) if (words[next]) out.push(words[next++]);
  }
  return [...out, ...words.slice(next)];
}

/**
 * Check a write command's options. `key` is the command name or `git SUB`;
 * `words[0]` is the command (or the git subcommand). Returns
 * { ok: true, files } or { ok: false, reason }.
 */
export function checkWriteArgs(key, words, mayBeOption) {
  const spec = PARSED.get(key);
  if (!spec) return { ok: false, reason: `${key} is not a command known to only change files` };
  const argv = key === "tar" ? tarOldStyle(words, spec) : words;
  const r = checkArgs(key, argv, mayBeOption, spec);
  if (!r.ok) return { ok: false, reason: r.reason.replace("is not a known read-only option", "is not an option known not to run programs") };
  return r;
}

export function isKnownWrite(key) {
  return PARSED.has(key);
}
