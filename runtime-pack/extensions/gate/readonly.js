// The read-only allowlist: which commands, with which options, only read.
//
// Default-deny. A command is a read only when its name is listed here AND every
// option on its command line is listed for it (exact spelling: GNU's unique
// prefixes such as `--out` for `--output` are not accepted). An option whose
// argument is a file the command writes is listed with `=W` and becomes a write
// of that file. Anything else (unknown option, unknown command) is not a read;
// the caller turns it into `shell` (ask).
//
// Option syntax in the tables (space-separated):
//   -x        short flag (may be clustered: -la)
//   -x=       short option with an argument (-n5 or -n 5)
//   --foo     long flag
//   --foo=    long option with an argument (--foo=v or --foo v)
//   --foo?    long option with an optional argument (only --foo or --foo=v)
//   ...=W     the argument is a file the command writes
//   ...=R     the argument is a file the command reads
//   ...=2     two arguments (jq --arg NAME VALUE); =2R: the second is a file read
//   -NUM      a bare number (-5 = -n 5)
//   -xyz:     a single-dash long option (xxd -cols, find -name) with an argument: `-xyz:`,
//             without: `-xyz.`

const COMMON = "--help --version";
const SUM_OPTS = "-b -t -z --binary --text --tag --zero";

/**
 * pos: how positionals are taken
 *   "paths"   every positional is a file/dir read
 *   "pattern" the first positional is a pattern (unless -e/-f/--regexp/--file given), the rest paths
 *   "none"    positionals are not paths
 *   "xxd"     [infile [outfile]]: the second is written
 *   "uniq"    [input [output]]: the second is written
 *   "date"    only +FORMAT positionals (`date MMDDhhmm` sets the clock)
 *   "nopos"   no positional allowed at all (hostname NAME sets the host name)
 * dflt: positional used when none is given (ls -> .)
 * anyArgs: the command has no option that writes, runs or reads files: any word is fine
 */
export const SPECS = {
  cat: { o: "-A -b -e -E -n -s -t -T -u -v --show-all --number-nonblank --show-ends --number --squeeze-blank --show-tabs --show-nonprinting", pos: "paths" },
  tac: { o: "-b -r -s= --before --regex --separator=", pos: "paths" },
  head: { o: "-c= -n= -q -v -z --bytes= --lines= --quiet --silent --verbose --zero-terminated -NUM", pos: "paths" },
  tail: { o: "-c= -n= -q -v -z -f -F -s= --bytes= --lines= --quiet --silent --verbose --zero-terminated --follow --follow= --retry --sleep-interval= --pid= --max-unchanged-stats= -NUM", pos: "paths" },
  wc: { o: "-c -m -l -L -w --bytes --chars --lines --max-line-length --words --total=", pos: "paths" },
  ls: {
    o: "-a -A -b -B -c -C -d -D -f -F -g -G -h -H -i -k -l -L -m -n -N -o -p -q -Q -r -R -s -S -t -u -U -v -w= -x -X -Z -1 -I= -T= --all --almost-all --author --escape --block-size= --ignore-backups --color? --directory --dired --classify? --file-type --format= --full-time --group-directories-first --no-group --human-readable --si --dereference-command-line --dereference-command-line-symlink-to-dir --hide= --hyperlink? --indicator-style= --inode --ignore= --kibibytes --dereference --numeric-uid-gid --literal --hide-control-chars --show-control-chars --quote-name --quoting-style= --reverse --recursive --size --sort= --time= --time-style= --tabsize= --width= --context --zero",
    pos: "paths",
    dflt: ".",
  },
  // no -R (writes 00Tree.html in every directory), no --fromfile
  tree: { o: "-a -d -l -f -x -L= -P= -I= --gitignore --ignore-case --matchdirs --metafirst --prune --info --noreport --charset= --filelimit= --dirsfirst --filesfirst -q -N -Q -p -u -g -s -h --si --du -D --timefmt= -F --inodes --device -v -t -c -U -r --sort= -i -A -S -n -C -X -J -H= -T= --nolinks -o=W", pos: "paths", dflt: "." },
  stat: { o: "-L -f -t -c= --format= --printf= --dereference --file-system --terse --cached=", pos: "paths" },
  // no -C (compiles magic files), no -f (reads the files a list names)
  file: { o: "-b -i -k -L -h -z -Z -s -r -0 -N -E -p -e= -m=R -F= -P= --brief --mime --mime-type --mime-encoding --keep-going --dereference --no-dereference --uncompress --uncompress-noreport --special-files --raw --print0 --no-pad --extension --apple --preserve-date --exclude= --magic-file=R --separator= --parameter=", pos: "paths" },
  du: { o: "-a -b -B= -c -d= -D -h -H -k -l -L -m -P -s -S -t= -x -X=R -0 --all --apparent-size --block-size= --bytes --total --max-depth= --dereference-args --human-readable --inodes --si --count-links --dereference --no-dereference --separate-dirs --summarize --threshold= --time --time= --time-style= --exclude-from=R --exclude= --one-file-system --null", pos: "paths", dflt: "." },
  df: { o: "-a -B= -h -H -i -k -l -P -t= -T -x= --all --block-size= --human-readable --si --inodes --local --no-sync --sync --output? --portability --print-type --total --type= --exclude-type=", pos: "paths" },
  grep: { o: GREP_OPTS(), pos: "pattern" },
  egrep: { o: GREP_OPTS(), pos: "pattern" },
  fgrep: { o: GREP_OPTS(), pos: "pattern" },
  zgrep: { o: GREP_OPTS(), pos: "pattern" },
  // no --pre/--pre-glob (run a program per file), -z/--search-zip (runs decompressors),
  // --hostname-bin (runs a program), --no-config is fine, --ignore-file reads a file
  rg: {
    o: "-A= -B= -C= -a -b -c -e= -E= -f=R -F -g= -H -h -i -I -j= -l -L -m= -M= -n -N -o -p -P -q -r= -s -S -t= -T= -u -uu -uuu -U -v -V -w -x -0 --after-context= --before-context= --context= --binary --block-buffered --byte-offset --case-sensitive --color= --colors= --column --no-column --context-separator= --count --count-matches --crlf --debug --dfa-size-limit= --encoding= --engine= --field-context-separator= --field-match-separator= --file=R --files --files-with-matches --files-without-match --fixed-strings --follow --glob= --glob-case-insensitive --heading --no-heading --hidden --no-hidden --iglob= --ignore-case --ignore-file=R --ignore-file-case-insensitive --include-zero --invert-match --json --no-json --line-buffered --line-number --line-regexp --max-columns= --max-columns-preview --max-count= --max-depth= --max-filesize= --mmap --no-mmap --multiline --multiline-dotall --no-config --no-ignore --no-ignore-dot --no-ignore-exclude --no-ignore-files --no-ignore-global --no-ignore-parent --no-ignore-vcs --no-ignore-messages --no-messages --no-line-number --no-filename --with-filename --null --null-data --one-file-system --only-matching --passthru --path-separator= --pcre2 --no-pcre2 --pretty --quiet --regex-size-limit= --regexp= --replace= --smart-case --sort= --sortr= --stats --text --threads= --trim --type= --type-not= --type-list --unrestricted --vimgrep --word-regexp --no-unicode --auto-hybrid-regex --max-depth= --hyperlink-format= --generate=",
    pos: "pattern",
    dflt: ".",
  },
  // no -x/--exec/-X/--exec-batch (run a command per match), no -l/--list-details (runs ls)
  fd: { o: FD_OPTS(), pos: "pattern", dflt: "." },
  fdfind: { o: FD_OPTS(), pos: "pattern", dflt: "." },
  diff: {
    o: "-a -b -B -c -C= -d -D= -e -E -f -F= -i -I= -l -L= -n -N -p -P -q -r -s -S= -t -T -u -U= -v -w -W= -x= -X=R -y -Z --normal --brief --report-identical-files --context? --unified? --ed --rcs --side-by-side --left-column --suppress-common-lines --show-c-function --show-function-line= --label= --expand-tabs --initial-tab --tabsize= --suppress-blank-empty --paginate --new-file --unidirectional-new-file --ignore-case --ignore-tab-expansion --ignore-trailing-space --ignore-space-change --ignore-all-space --ignore-blank-lines --ignore-matching-lines= --text --strip-trailing-cr --recursive --no-dereference --exclude= --exclude-from=R --starting-file= --from-file=R --to-file=R --ignore-file-name-case --no-ignore-file-name-case --width= --minimal --horizon-lines= --speed-large-files --color? --palette= --ifdef= --line-format= --old-line-format= --new-line-format= --unchanged-line-format= --old-group-format= --new-group-format= --changed-group-format= --unchanged-group-format=",
    pos: "paths",
  },
  cmp: { o: "-b -i= -l -n= -s --print-bytes --ignore-initial= --verbose --bytes= --quiet --silent", pos: "paths" },
  comm: { o: "-1 -2 -3 -z --check-order --nocheck-order --output-delimiter= --total --zero-terminated", pos: "paths" },
  // no -c/--check: it reads every file the list names
  md5sum: { o: SUM_OPTS, pos: "paths" },
  sha1sum: { o: SUM_OPTS, pos: "paths" },
  sha224sum: { o: SUM_OPTS, pos: "paths" },
  sha256sum: { o: SUM_OPTS, pos: "paths" },
  sha384sum: { o: SUM_OPTS, pos: "paths" },
  sha512sum: { o: SUM_OPTS, pos: "paths" },
  b2sum: { o: SUM_OPTS + " -l= --length=", pos: "paths" },
  cksum: { o: SUM_OPTS + " -a= -l= --algorithm= --length= --raw --untagged --base64", pos: "paths" },
  nl: { o: "-b= -d= -f= -h= -i= -l= -n= -p -s= -v= -w= --body-numbering= --section-delimiter= --footer-numbering= --header-numbering= --line-increment= --join-blank-lines= --number-format= --no-renumber --number-separator= --starting-line-number= --number-width=", pos: "paths" },
  cut: { o: "-b= -c= -d= -f= -n -s -z --bytes= --characters= --delimiter= --fields= --complement --only-delimited --output-delimiter= --zero-terminated", pos: "paths" },
  tr: { o: "-c -C -d -s -t --complement --delete --squeeze-repeats --truncate-set1", pos: "none" },
  paste: { o: "-d= -s -z --delimiters= --serial --zero-terminated", pos: "paths" },
  fold: { o: "-b -s -w= --bytes --spaces --width=", pos: "paths" },
  fmt: { o: "-c -p= -s -t -u -w= -g= --crown-margin --prefix= --split-only --tagged-paragraph --uniform-spacing --width= --goal= -NUM", pos: "paths" },
  column: { o: "-c= -d -e -E= -H= -i= -J -l= -L -n= -N= -o= -O= -p= -r= -R= -s= -t -T= -W= -x --columns= --table --separator= --output-separator= --table-columns= --table-name= --json --keep-empty-lines --fillrows", pos: "paths" },
  expand: { o: "-i -t= --initial --tabs= -NUM", pos: "paths" },
  unexpand: { o: "-a -t= --all --first-only --tabs=", pos: "paths" },
  rev: { o: "-0 --zero", pos: "paths" },
  strings: { o: "-a -d -f -n= -t= -e= -w -s= -T= -o -U= --all --data --print-file-name --bytes= --radix= --encoding= --include-all-whitespace --output-separator= --unicode= -NUM", pos: "paths" },
  // xxd INFILE OUTFILE writes OUTFILE (with or without -r)
  xxd: { o: "-a -b -C -d -e -E -h -i -p -r -u -v -R= -c= -g= -l= -n= -o= -s= -autoskip. -bits. -capitalize. -EBCDIC. -include. -ps. -postscript. -plain. -revert. -uppercase. -version. -cols: -groupsize: -len: -name: -offset: -seek:", pos: "xxd" },
  od: { o: "-A= -b -c -d -f -i -j= -l -N= -o -s -S= -t= -v -w= -x --address-radix= --endian= --skip-bytes= --read-bytes= --strings? --format= --output-duplicates --width? --traditional", pos: "paths" },
  hexdump: { o: "-b -c -C -d -o -x -v -e= -f=R -n= -s= -L? --canonical --length= --skip= --no-squeezing --format= --format-file=R --color?", pos: "paths" },
  jq: { o: "-r -j -a -c -n -e -s -S -C -M -R -h -V -L= -f=R --raw-output --raw-output0 --join-output --ascii-output --compact-output --null-input --exit-status --slurp --sort-keys --color-output --monochrome-output --raw-input --tab --indent= --seq --stream --stream-errors --unbuffered --from-file=R --arg=2 --argjson=2 --slurpfile=2R --rawfile=2R --args --jsonargs --build-configuration", pos: "pattern" },
  sort: { o: "-b -c -C -d -f -g -h -i -M -m -n -R -r -s -u -V -z -k= -t= -o=W -S= -T=W --ignore-leading-blanks --dictionary-order --ignore-case --general-numeric-sort --ignore-nonprinting --month-sort --human-numeric-sort --numeric-sort --random-sort --random-source=R --reverse --sort= --version-sort --batch-size= --check? --debug --merge --key= --output=W --stable --buffer-size= --field-separator= --temporary-directory=W --parallel= --unique --zero-terminated", pos: "paths" },
  uniq: { o: "-c -d -D -f= -i -s= -u -w= -z --count --repeated --all-repeated? --skip-fields= --group? --ignore-case --skip-chars= --unique --zero-terminated --check-chars=", pos: "uniq" },
  join: { o: "-a= -e= -i -j= -o= -t= -v= -z -1= -2= --check-order --nocheck-order --header --ignore-case --zero-terminated", pos: "paths" },
  look: { o: "-a -b -d -f -t=", pos: "pattern" },
  base64: { o: "-d -i -w= --decode --ignore-garbage --wrap=", pos: "paths" },
  base32: { o: "-d -i -w= --decode --ignore-garbage --wrap=", pos: "paths" },
  iconv: { o: "-c -l -s -f= -t= -o=W --from-code= --to-code= --list --silent --output=W", pos: "paths" },
  zcat: { o: "-f -q -v -l -n -N -t --force --quiet --verbose --list --no-name --name --test", pos: "paths" },
  bzcat: { o: "-s -q -v --small --quiet --verbose", pos: "paths" },
  xzcat: { o: "-q -v -T= -F= --quiet --verbose --threads= --format= --single-stream --no-sparse", pos: "paths" },
  realpath: { o: "-e -m -L -P -q -s -z --canonicalize-existing --canonicalize-missing --logical --physical --quiet --relative-to= --relative-base= --strip --no-symlinks --zero", pos: "paths" },
  readlink: { o: "-f -e -m -n -q -s -v -z --canonicalize --canonicalize-existing --canonicalize-missing --no-newline --quiet --silent --verbose --zero", pos: "paths" },
  pwd: { o: "-L -P", pos: "none" },
  date: { o: "-d= -f=R -I? -r=R -R -u --date= --file=R --iso-8601? --resolution --rfc-3339= --rfc-email --reference=R --debug --utc --universal", pos: "date" },
  hostname: { o: "-a -A -d -f -i -I -s -y --alias --all-fqdns --domain --fqdn --long --ip-address --all-ip-addresses --short --yp --nis", pos: "nopos" },
  // no -v: it assigns a variable (printf -v PATH ...)
  printf: { o: "", pos: "none", anyArgs: true, noOpts: true },
  echo: { o: "", pos: "none", anyArgs: true },
  true: { o: "", pos: "none", anyArgs: true },
  false: { o: "", pos: "none", anyArgs: true },
  ":": { o: "", pos: "none", anyArgs: true },
  test: { o: "", pos: "none", anyArgs: true },
  "[": { o: "", pos: "none", anyArgs: true },
  "[[": { o: "", pos: "none", anyArgs: true },
  "]]": { o: "", pos: "none", anyArgs: true },
  basename: { o: "", pos: "none", anyArgs: true },
  dirname: { o: "", pos: "none", anyArgs: true },
  seq: { o: "", pos: "none", anyArgs: true },
  sleep: { o: "", pos: "none", anyArgs: true },
  which: { o: "", pos: "none", anyArgs: true },
  whereis: { o: "", pos: "none", anyArgs: true },
  type: { o: "", pos: "none", anyArgs: true },
  whoami: { o: "", pos: "none", anyArgs: true },
  id: { o: "", pos: "none", anyArgs: true },
  groups: { o: "", pos: "none", anyArgs: true },
  uname: { o: "", pos: "none", anyArgs: true },
  printenv: { o: "", pos: "none", anyArgs: true },
  ps: { o: "", pos: "none", anyArgs: true },
  free: { o: "", pos: "none", anyArgs: true },
  uptime: { o: "", pos: "none", anyArgs: true },
  nproc: { o: "", pos: "none", anyArgs: true },
  lscpu: { o: "", pos: "none", anyArgs: true },
  lsblk: { o: "", pos: "none", anyArgs: true },
  findmnt: { o: "", pos: "none", anyArgs: true },
  locale: { o: "", pos: "none", anyArgs: true },
  tput: { o: "", pos: "none", anyArgs: true },
  clear: { o: "", pos: "none", anyArgs: true },
  arch: { o: "", pos: "none", anyArgs: true },
  getconf: { o: "", pos: "none", anyArgs: true },
  numfmt: { o: "", pos: "none", anyArgs: true },
  exit: { o: "", pos: "none", anyArgs: true },
  return: { o: "", pos: "none", anyArgs: true },
  break: { o: "", pos: "none", anyArgs: true },
  continue: { o: "", pos: "none", anyArgs: true },
  shift: { o: "", pos: "none", anyArgs: true },
  wait: { o: "", pos: "none", anyArgs: true },
  jobs: { o: "", pos: "none", anyArgs: true },
  umask: { o: "", pos: "none", anyArgs: true },
  ulimit: { o: "", pos: "none", anyArgs: true },
  set: { o: "", pos: "none", anyArgs: true },
  unset: { o: "", pos: "none", anyArgs: true },
  dirs: { o: "", pos: "none", anyArgs: true },
  popd: { o: "", pos: "none", anyArgs: true },
  hash: { o: "-r -t -l -d", pos: "none" },
  shopt: { o: "-p -q -o", pos: "none" },
};

function GREP_OPTS() {
  return "-a -b -c -E -F -G -h -H -i -I -l -L -n -o -P -q -r -R -s -T -U -v -V -w -x -y -z -Z -e= -f=R -m= -A= -B= -C= -d= -D= -NUM --extended-regexp --fixed-strings --basic-regexp --perl-regexp --regexp= --file=R --ignore-case --no-ignore-case --word-regexp --line-regexp --null-data --no-messages --invert-match --max-count= --byte-offset --line-number --line-buffered --with-filename --no-filename --label= --only-matching --quiet --silent --binary-files= --text --directories= --devices= --recursive --dereference-recursive --include= --exclude= --exclude-from=R --exclude-dir= --files-without-match --files-with-matches --count --initial-tab --null --before-context= --after-context= --context= --color? --colour? --binary";
}
function FD_OPTS() {
  return "-H -I -u -s -i -g -F -a -L -p -0 -h -V -1 -q -d= -t= -e= -E= -c= -j= -S= --hidden --no-hidden --no-ignore --ignore --no-ignore-vcs --ignore-vcs --no-ignore-parent --no-global-ignore-file --unrestricted --case-sensitive --ignore-case --glob --regex --fixed-strings --and= --absolute-path --relative-path --follow --no-follow --full-path --print0 --max-depth= --min-depth= --exact-depth= --exclude= --prune --type= --extension= --size= --changed-within= --changed-before= --change-newer-than= --change-older-than= --newer= --older= --owner= --format= --color= --threads= --max-results= --quiet --show-errors --base-directory= --path-separator= --search-path= --strip-cwd-prefix? --one-file-system --ignore-file=R --max-buffer-time= --hyperlink?";
}
for (const spec of Object.values(SPECS)) spec.parsed = parseSpec(`${spec.o} ${COMMON}`);

export function parseSpec(text) {
  const p = { short: new Map(), long: new Map(), single: new Map(), numeric: false };
  for (const tok of text.split(/\s+/).filter(Boolean)) {
    if (tok === "-NUM") {
      p.numeric = true;
      continue;
    }
    let m = /^-([A-Za-z]+)([:.])$/.exec(tok);
    if (m && m[1].length > 1) {
      p.single.set(m[1], m[2] === ":" ? { arg: 1, kind: null } : { arg: 0 });
      continue;
    }
    m = /^(--?)([A-Za-z0-9][A-Za-z0-9-]*)(\?|=([0-9]?)([WR]?))?$/.exec(tok);
    if (!m) throw new Error(`bad option spec ${tok}`);
    const [, dashes, name, suffix, n, kind] = m;
    const info = suffix === undefined ? { arg: 0 } : suffix === "?" ? { arg: 0, optional: true } : { arg: n ? Number(n) : 1, kind: kind || null };
    if (dashes === "--") p.long.set(name, info);
    else if (name.length === 1) p.short.set(name, info);
    else p.single.set(name, info); // -uu, -uuu
  }
  return p;
}

/**
 * Check a read-only candidate's argv (words[0] is the command).
 * Returns { ok: true, positionals, files: [{op, word}] } or { ok: false, reason }.
 * `mayBeOption(word)` tells whether a word could expand to something starting with `-`.
 * `argOk(word)`: may this word stand as an option's separate argument? A glob
 * there (`-k *`) can become several words, the later ones options.
 */
export function checkArgs(name, words, mayBeOption, spec = SPECS[name], argOk = (w) => !w.glob) {
  if (!spec) return { ok: false, reason: `${name} is not a known read-only command` };
  const p = spec.parsed;
  const positionals = [];
  const files = [];
  let endOpts = false;
  for (let i = 1; i < words.length; i++) {
    const w = words[i];
    const t = w.text;
    if (spec.anyArgs) {
      if (spec.noOpts && !endOpts && (t.startsWith("-") || mayBeOption(w)) && i === 1 && t !== "--") return { ok: false, reason: `${name} ${t}: options are not inspected` };
      positionals.push(w);
      continue;
    }
    if (endOpts || t === "-" || (!t.startsWith("-") && !mayBeOption(w))) {
      positionals.push(w);
      continue;
    }
    if (!t.startsWith("-") || w.glob) return { ok: false, reason: `${name}: an argument could expand to an option` };
    if (t === "--") {
      endOpts = true;
      continue;
    }
    const take = (info, inline, label) => {
      // returns false when the argument is missing
      const n = info.arg;
      const args = [];
      if (inline !== undefined) args.push({ ...w, text: inline });
      while (args.length < n) {
        const next = words[++i];
        if (!next || !argOk(next)) return false;
        args.push(next);
      }
      if (info.kind === "W") files.push({ op: "write", word: args[n - 1], reason: `${name} ${label} writes this file` });
      if (info.kind === "R") files.push({ op: "read", word: args[n - 1], reason: `${name} ${label} reads this file` });
      return true;
    };
    if (t.startsWith("--")) {
      const eq = t.indexOf("=");
      const optName = eq < 0 ? t.slice(2) : t.slice(2, eq);
      const inline = eq < 0 ? undefined : t.slice(eq + 1);
      const info = p.long.get(optName);
      if (!info) return { ok: false, reason: `${name} --${optName} is not a known read-only option` };
      if (info.arg === 0) {
        if (inline !== undefined && !info.optional) return { ok: false, reason: `${name} --${optName} takes no value` };
        continue;
      }
      if (inline !== undefined && info.arg > 1) return { ok: false, reason: `${name} --${optName}: unexpected form` };
      if (!take(info, inline, `--${optName}`)) return { ok: false, reason: `${name} --${optName} without its argument, or with one that may expand to several words` };
      continue;
    }
    if (p.numeric && /^-[0-9]+$/.test(t)) continue;
    const single = p.single.get(t.slice(1));
    if (single) {
      if (single.arg && !take(single, undefined, t)) return { ok: false, reason: `${name} ${t} without its argument, or with one that may expand to several words` };
      continue;
    }
    // a cluster of short options
    for (let j = 1; j < t.length; j++) {
      const c = t[j];
      const info = p.short.get(c);
      if (!info) return { ok: false, reason: `${name} -${c} is not a known read-only option` };
      if (info.arg === 0) continue;
      const rest = t.slice(j + 1);
      if (!take(info, rest.length ? rest : undefined, `-${c}`)) return { ok: false, reason: `${name} -${c} without its argument, or with one that may expand to several words` };
      break;
    }
  }
  return { ok: true, positionals, files };
}

// ---------------------------------------------------------------------------
// sed and awk programs

/**
 * True when a sed script only prints/edits the stream: no `e` (run a command),
 * `w`/`W` (write a file), `r`/`R` (read any file), no `s///e` or `s///w`.
 * A small parser of the POSIX/GNU grammar; anything it does not follow is unsafe.
 */
export function sedScriptSafe(script) {
  let i = 0;
  const s = script;
  const ws = () => {
    while (i < s.length && /[\s;]/.test(s[i])) i++;
  };
  const regex = () => {
    // s[i] is the delimiter (/ or \c)
    let delim = s[i];
    if (delim === "\\") {
      i++;
      delim = s[i];
    }
    if (delim === undefined || delim === "\n" || delim === "\\") return false;
    i++;
    while (i < s.length && s[i] !== delim) {
      if (s[i] === "\\") i++;
      else if (s[i] === "\n") return false;
      i++;
    }
    if (i >= s.length) return false;
    i++;
    return true;
  };
  const address = () => {
    if (/[0-9]/.test(s[i] ?? "")) {
      while (/[0-9~]/.test(s[i] ?? "")) i++;
      return true;
    }
    if (s[i] === "$") {
      i++;
      return true;
    }
    if (s[i] === "/" || s[i] === "\\") {
      if (!regex()) return false;
      while (s[i] === "I" || s[i] === "M") i++;
      return true;
    }
    return true; // no address
  };
  const toEol = () => {
    while (i < s.length && s[i] !== "\n") i++;
  };
  const label = () => {
    while (i < s.length && s[i] !== "\n" && s[i] !== ";") i++;
  };
  while (true) {
    ws();
    if (i >= s.length) return true;
    if (s[i] === "#") {
      toEol();
      continue;
    }
    if (!address()) return false;
    if (s[i] === ",") {
      i++;
      if (s[i] === "+" || s[i] === "~") i++;
      if (!address()) return false;
    }
    while (s[i] === " " || s[i] === "\t") i++;
    if (s[i] === "!") {
      i++;
      while (s[i] === " " || s[i] === "\t") i++;
    }
    const c = s[i++];
    if (c === undefined) return false;
    if ("pPdDnNgGhHxzlF=qQ{}".includes(c)) {
      if ((c === "q" || c === "Q" || c === "l") && /[0-9]/.test(s[i] ?? "")) while (/[0-9]/.test(s[i] ?? "")) i++;
      continue;
    }
    if (c === ":" || c === "b" || c === "t" || c === "T") {
      label();
      continue;
    }
    if (c === "a" || c === "i" || c === "c") {
      // text to the end of the line (GNU one-liner form or `a\` + next line)
      if (s[i] === "\\") {
        i++;
        if (s[i] === "\n") i++;
      }
      while (i < s.length && s[i] !== "\n") {
        if (s[i] === "\\") i++;
        i++;
      }
      continue;
    }
    if (c === "y") {
      const delim = s[i];
      if (delim === undefined || delim === "\\" || delim === "\n") return false;
      for (let part = 0; part < 2; part++) {
        i++;
        while (i < s.length && s[i] !== delim) {
          if (s[i] === "\\") i++;
          i++;
        }
        if (i >= s.length) return false;
      }
      i++;
      continue;
    }
    if (c === "s") {
      const delim = s[i];
      if (delim === undefined || delim === "\\" || delim === "\n") return false;
      for (let part = 0; part < 2; part++) {
        i++;
        while (i < s.length && s[i] !== delim) {
          if (s[i] === "\\") i++;
          i++;
        }
        if (i >= s.length) return false;
      }
      i++;
      // flags: only g p i I m M and a number; never e (execute) or w (write)
      while (i < s.length && /[gpiImM0-9]/.test(s[i])) i++;
      if (i < s.length && !/[\s;}]/.test(s[i])) return false;
      continue;
    }
    return false; // e, w, W, r, R, v, and anything unknown
  }
}

/**
 * True when an awk program cannot run commands, write files or read other files:
 * no system(), no pipes or output redirection (`|`, `>`), no getline, no
 * close/fflush, no gawk @load/@include. Comparisons with `>` are refused too
 * (the parser does not tell them from redirection): such programs ask.
 */
export function awkProgramSafe(program) {
  return !/system|getline|\||>|close|fflush|@/.test(program);
}

// ---------------------------------------------------------------------------
// git: read-only subcommands and the options each may carry. Not allowed
// anywhere: --output (writes a file), --ext-diff / --textconv (run configured
// programs), --show-signature (runs gpg), --no-index (reads outside the repo),
// -O/--open-files-in-pager (runs a pager), help -w/-i/-m (run a browser or viewer).

const GIT_LOG_DIFF =
  "--output=W -p -u -s -z -w -b -R -M -C -B -D -E -F -i -a -c -m -W --patch --no-patch --stat? --shortstat --numstat --name-only --name-status --summary --compact-summary --dirstat? --raw --full-index --binary --abbrev? --no-abbrev --abbrev-commit --no-abbrev-commit --oneline --graph --decorate? --no-decorate --all --format= --pretty? --date= --relative-date --since= --after= --until= --before= --author= --committer= --grep= --all-match --invert-grep --regexp-ignore-case --extended-regexp --fixed-strings --perl-regexp --merges --no-merges --min-parents= --max-parents= --first-parent --reverse --follow --max-count= -n= -NUM --skip= --topo-order --date-order --author-date-order --branches? --tags? --remotes? --glob= --exclude= --cached --staged --color? --no-color --color-moved? --word-diff? --word-diff-regex= --color-words? --unified= -U= --ignore-all-space --ignore-space-change --ignore-space-at-eol --ignore-cr-at-eol --ignore-blank-lines --diff-filter= --find-renames? --find-copies? --find-copies-harder --no-renames --minimal --patience --histogram --diff-algorithm= -S= -G= --pickaxe-all --pickaxe-regex --no-prefix --src-prefix= --dst-prefix= --default-prefix --relative? --no-relative --exit-code --quiet --check --left-right --cherry-pick --cherry-mark --cherry --boundary --ancestry-path --simplify-by-decoration --full-history --simplify-merges --sparse --dense --no-walk? --do-walk --log-size --parents --children --notes? --no-notes --mailmap --no-mailmap --use-mailmap --encoding= --expand-tabs? --no-expand-tabs --no-ext-diff --no-textconv --ignore-submodules? --submodule? --ws-error-highlight= --line-prefix= --stat-width= --stat-name-width= --stat-count= --stat-graph-width= -L= --cc --combined-all-paths --diff-merges= --no-diff-merges --remerge-diff --function-context --inter-hunk-context= --text --irreversible-delete --break-rewrites? --anchored= --indent-heuristic --no-indent-heuristic --source --clear-decorations --decorate-refs= --decorate-refs-exclude= --show-linear-break? --count --single-worktree --ignore-missing --bisect --in-commit-order --merge --objects --objects-edge --unpacked --timestamp --max-age= --min-age= --show-pulls --no-min-parents --no-max-parents --walk-reflogs -g --numbered -e --email --summary --group= --committer -q --name-only --merge-base";

export const GIT_READ_OPTS = {
  status: "-s -b -v -u -z --short --branch --porcelain? --long --verbose --untracked-files? --ignored? --ignore-submodules? --column? --no-column --ahead-behind --no-ahead-behind --renames --no-renames --find-renames? --show-stash",
  log: GIT_LOG_DIFF,
  show: GIT_LOG_DIFF,
  diff: GIT_LOG_DIFF,
  whatchanged: GIT_LOG_DIFF,
  shortlog: GIT_LOG_DIFF,
  "rev-list": GIT_LOG_DIFF,
  "rev-parse": "-q --verify --quiet --short? --abbrev-ref? --symbolic --symbolic-full-name --show-toplevel --show-prefix --show-cdup --git-dir --git-common-dir --absolute-git-dir --is-inside-work-tree --is-inside-git-dir --is-bare-repository --is-shallow-repository --show-superproject-working-tree --show-object-format? --all --branches? --tags? --remotes? --glob= --since= --until= --default= --sq --sq-quote --not --local-env-vars --path-format= --git-path= --resolve-git-dir= --shared-index-path --show-ref-format --end-of-options",
  "ls-files": "-c -d -m -o -i -s -u -k -t -v -f -z --cached --deleted --modified --others --ignored --stage --unmerged --killed --directory --no-empty-directory --eol --exclude= -x= --exclude-standard --error-unmatch --full-name --recurse-submodules --abbrev? --debug --deduplicate --format= --sparse",
  "ls-tree": "-d -r -t -l -z --long --name-only --name-status --object-only --full-name --full-tree --abbrev? --format=",
  blame: "-b -c -e -f -l -n -p -s -t -w -M? -C? -L= -S=R --root --show-stats --score-debug --show-name --show-number --show-email --porcelain --line-porcelain --incremental --date= --progress --no-progress --abbrev= --ignore-rev= --ignore-revs-file=R --color-lines --color-by-age --minimal --reverse= --first-parent --encoding= --contents=R",
  grep: "-a -c -e= -E -F -G -h -H -i -I -l -L -n -o -P -q -r -v -w -z -A= -B= -C= -f=R -m= -NUM --cached --untracked --exclude-standard --recurse-submodules --text --ignore-case --word-regexp --invert-match --full-name --extended-regexp --basic-regexp --perl-regexp --fixed-strings --line-number --column --files-with-matches --name-only --files-without-match --null --only-matching --count --color? --no-color --break --heading --show-function --function-context --after-context= --before-context= --context= --threads= --max-depth= --max-count= --and --or --not --all-match --quiet --recursive --no-recursive",
  describe: "--all --tags --contains --abbrev= --candidates= --exact-match --debug --long --match= --exclude= --always --first-parent --dirty? --broken?",
  "cat-file": "-t -s -e -p --batch? --batch-check? --batch-command? --batch-all-objects --buffer --unordered --follow-symlinks --allow-unknown-type --use-mailmap --no-use-mailmap -Z",
  "name-rev": "--tags --refs= --exclude= --all --annotate-stdin --name-only --no-undefined --always",
  "merge-base": "-a --all --octopus --independent --is-ancestor --fork-point",
  "for-each-ref": "--count= --sort= --format= --shell --perl --python --tcl --points-at= --merged? --no-merged? --contains? --no-contains? --ignore-case --omit-empty --exclude= --color?",
  "show-ref": "-d -s -q --head --tags --heads --branches --dereference --hash? --abbrev? --verify --exists --quiet --exclude-existing?",
  "check-ignore": "-q -v -n -z --quiet --verbose --non-matching --stdin",
  reflog: "",
  help: "-a -g --all --guides --verbose",
  version: "--build-options",
  "--version": "",
};
for (const [sub, text] of Object.entries(GIT_READ_OPTS)) {
  GIT_READ_OPTS[sub] = { o: text, pos: "none", parsed: parseSpec(`${text} ${COMMON}`) };
}

/** Check a git read subcommand's argv (words[0] is the subcommand). */
export function checkGitArgs(sub, words, mayBeOption) {
  const spec = GIT_READ_OPTS[sub];
  if (!spec) return { ok: false, reason: `git ${sub} is not a known read-only subcommand` };
  return checkArgs(`git ${sub}`, words, mayBeOption, spec);
}

// find's expression: primaries that only test or print (value: how many arguments).
// -delete, -exec*, -ok*, -fprint*, -fls are handled by the caller; anything else asks.
export const FIND_PRIMARIES = new Map(
  Object.entries({
    "-name": 1, "-iname": 1, "-path": 1, "-ipath": 1, "-wholename": 1, "-iwholename": 1, "-regex": 1, "-iregex": 1,
    "-lname": 1, "-ilname": 1, "-type": 1, "-xtype": 1, "-size": 1, "-mtime": 1, "-mmin": 1, "-atime": 1, "-amin": 1,
    "-ctime": 1, "-cmin": 1, "-newer": 1, "-anewer": 1, "-cnewer": 1, "-perm": 1, "-user": 1, "-group": 1,
    "-uid": 1, "-gid": 1, "-links": 1, "-inum": 1, "-samefile": 1, "-maxdepth": 1, "-mindepth": 1, "-regextype": 1,
    "-fstype": 1, "-used": 1, "-context": 1, "-printf": 1,
    "-nouser": 0, "-nogroup": 0, "-empty": 0, "-executable": 0, "-readable": 0, "-writable": 0, "-depth": 0, "-d": 0,
    "-xdev": 0, "-mount": 0, "-follow": 0, "-noleaf": 0, "-print": 0, "-print0": 0, "-ls": 0, "-prune": 0, "-quit": 0,
    "-true": 0, "-false": 0, "-not": 0, "-a": 0, "-and": 0, "-o": 0, "-or": 0, "-daystart": 0,
    "-ignore_readdir_race": 0, "-noignore_readdir_race": 0, "-help": 0, "--help": 0, "-version": 0, "--version": 0,
    "(": 0, ")": 0, "!": 0, ",": 0,
  }),
);
