// Permission-gate classifier: pure ESM, no pi imports, so `node --test` can
// exercise it without a build step. The extension (../permission-gate.ts)
// is a thin adapter around `classifyToolCall` and `buildSelect`.
//
// The contract with the host lives in docs/permission-protocol.md; keep the
// two in step (PROTOCOL_VERSION, MARKER, OPTIONS, action names).

import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";

import { FIND_PRIMARIES, SPECS, awkProgramSafe, checkArgs, checkGitArgs, sedScriptSafe } from "./readonly.js";
import { checkWriteArgs, isKnownWrite } from "./writes.js";

export const PROTOCOL_VERSION = 1;
export const MARKER_OPEN = '<piwork-permission v="1">';
export const MARKER_CLOSE = "</piwork-permission>";

/** The select options, in display order. The host answers with one of these strings. */
export const OPTIONS = Object.freeze({
  ALLOW_ONCE: "Allow once",
  ALWAYS_FOLDER: "Always allow in this folder",
  ALWAYS_EVERYWHERE: "Always allow everywhere",
  DENY: "Deny",
});
export const OPTION_LIST = Object.freeze([
  OPTIONS.ALLOW_ONCE,
  OPTIONS.ALWAYS_FOLDER,
  OPTIONS.ALWAYS_EVERYWHERE,
  OPTIONS.DENY,
]);

export const ACTIONS = Object.freeze([
  "read",
  "write",
  "delete",
  "move",
  "outside-scope",
  "network",
  "shell",
  "connector",
]);

// Higher = more serious; the request's headline `action` is the most serious effect.
const SEVERITY = {
  read: 0,
  write: 1,
  connector: 2,
  shell: 3,
  network: 4,
  move: 5,
  delete: 6,
  "outside-scope": 7,
};

// ---------------------------------------------------------------------------
// Configuration (env vars set by the host when it starts pi)

function splitDirs(value) {
  return (value || "")
    .split(":")
    .map((s) => s.trim())
    .filter((s) => s.length > 0 && path.isAbsolute(s));
}

function realOrSelf(p) {
  try {
    return fs.realpathSync(p);
  } catch {
    return path.resolve(p);
  }
}

/**
 * Read the gate's configuration from the environment.
 * PIWORK_SCOPE_DIRS     colon-separated dirs where reads/writes are "in scope"
 * PIWORK_READONLY_DIRS  colon-separated dirs where reads are in scope (writes are outside)
 * PIWORK_TASK_ID        copied into every request
 * PIWORK_GATE_AUTO_ALLOW  actions the gate allows without asking the host (default "read")
 */
export function loadConfig(env = process.env) {
  const scopeDirs = splitDirs(env.PIWORK_SCOPE_DIRS ?? "/mnt/work:/mnt/outputs");
  const readonlyDirs = splitDirs(env.PIWORK_READONLY_DIRS ?? "/mnt/uploads");
  const autoAllow = (env.PIWORK_GATE_AUTO_ALLOW ?? "read")
    .split(",")
    .map((s) => s.trim())
    .filter((s) => s === "read" || s === "write");
  return {
    // Both spellings: the literal one (what the model sees) and the real one.
    scopeDirs: unique([...scopeDirs, ...scopeDirs.map(realOrSelf)]),
    readonlyDirs: unique([...readonlyDirs, ...readonlyDirs.map(realOrSelf)]),
    taskId: env.PIWORK_TASK_ID || null,
    home: env.HOME || os.homedir(),
    autoAllow,
  };
}

function unique(xs) {
  return [...new Set(xs)];
}

// ---------------------------------------------------------------------------
// Path resolution

const MAX_LINKS = 40;

/**
 * Resolve `p` the way the kernel would: `~` and relative paths first, then
 * component by component, following symlinks of every existing prefix (so
 * `link/..` goes where the kernel goes, and a dangling link points at what a
 * write would create). Components past the longest existing prefix are
 * joined lexically. With `noFollowLast`, the final component is not
 * followed (rm/mv act on the link itself).
 * Returns null when the path cannot be known (`~user`, empty).
 */
export function resolvePath(p, cwd, opts = {}) {
  if (typeof p !== "string" || p.length === 0) return null;
  const home = opts.home ?? os.homedir();
  let s = p;
  if (s.startsWith("@")) s = s.slice(1); // pi strips a leading @ too
  if (s === "~") s = home;
  else if (s.startsWith("~/")) s = home + s.slice(1);
  else if (s.startsWith("~")) return null;
  // No path.join here: it would fold `link/..` lexically before symlinks are seen.
  const abs = path.isAbsolute(s) ? s : `${cwd || "/"}/${s}`;
  const trailingSlash = abs.length > 1 && abs.endsWith("/");
  const parts = abs.split("/").filter((c) => c.length > 0);
  let last = null;
  if (opts.noFollowLast && !trailingSlash && parts.length > 0) {
    const tail = parts[parts.length - 1];
    if (tail !== "." && tail !== "..") last = parts.pop();
  }
  const budget = { links: 0 };
  const resolved = walk("/", parts, budget);
  return last === null ? resolved : path.join(resolved, last);
}

function walk(start, parts, budget) {
  let current = start;
  let missing = false;
  for (let i = 0; i < parts.length; i++) {
    const comp = parts[i];
    if (comp === "." || comp === "") continue;
    if (comp === "..") {
      current = path.dirname(current);
      continue;
    }
    const next = path.join(current, comp);
    if (missing) {
      current = next;
      continue;
    }
    let st;
    try {
      st = fs.lstatSync(next);
    } catch {
      missing = true;
      current = next;
      continue;
    }
    if (st.isSymbolicLink()) {
      if (++budget.links > MAX_LINKS) return next; // loop: stop following
      let target;
      try {
        target = fs.readlinkSync(next);
      } catch {
        current = next;
        continue;
      }
      const base = path.isAbsolute(target) ? "/" : current;
      const tparts = target.split("/").filter((c) => c.length > 0);
      current = walk(base, tparts, budget);
    } else {
      current = next;
    }
  }
  return current;
}

export function isInside(p, dir) {
  if (p === dir) return true;
  const d = dir.endsWith("/") ? dir : dir + "/";
  return p.startsWith(d);
}

// ---------------------------------------------------------------------------
// Shell lexer: just enough of bash to find commands, arguments, redirects,
// substitutions and heredocs. Anything it does not understand makes the
// command "shell" (ask), never "read".

const OP_CHARS = new Set([";", "&", "|", "(", ")", "<", ">", "\n"]);

/**
 * Split a command line into simple commands.
 * Returns { commands: [{words: Word[], redirects: Redirect[]}], subs: string[], unsure: string[] }
 * Word = { text, dynamic, glob, quoted }
 * Redirect = { op, fd, target: Word | null }
 */
export function parseShell(src) {
  const lx = new Lexer(src);
  lx.run();
  return { commands: lx.commands, subs: lx.subs, unsure: lx.unsure, risky: lx.risky, compoundChild: lx.compoundChild === true };
}

// `$( )` inside `$( )` deeper than this is not followed (ask).
const MAX_NESTING = 24;

class Lexer {
  /**
   * `nested`: this lexer reads the inside of a `$( )` / `<( )` that starts at
   * `start` in `src`, with the same grammar as the top level (comments,
   * quotes, heredocs), and stops at the `)` that closes it; `this.end` is
   * that `)`'s index (or -1 when the source ends first).
   */
  constructor(src, { nested = false, start = 0, level = 0 } = {}) {
    this.src = src;
    this.i = start;
    this.nested = nested;
    this.level = level;
    this.parenDepth = 0;
    // the subshells the current command is in (ids, outermost first)
    this.frames = [];
    this.nextFrame = 0;
    this.end = -1;
    this.commands = [];
    this.subs = [];
    this.unsure = [];
    // bash-only constructs that evaluate runtime values as code (arithmetic
    // on variables, array subscripts, ${x@P}): always asked about
    this.risky = [];
    this.pendingHeredocs = [];
    this.cur = { words: [], redirects: [] };
    this.pendingRedirect = null;
  }

  flush(op = null) {
    if (this.pendingRedirect) {
      this.unsure.push(`redirect ${this.pendingRedirect.op} without a target`);
      this.pendingRedirect = null;
    }
    // Commands that run in a child shell: inside ( ), or in a pipeline or in
    // the background. A `cd` there does not move this shell.
    const child = op === "|" || op === "|&" || op === "&";
    if (child) {
      const first = this.cur.words[0];
      // a compound command piped or sent to the background runs whole in a child
      // (`{ cd x; } | cat`, `while …; done &`): where its cds run is not followed
      if (this.lastOp === ")" || (first && !first.quoted && ["}", "done", "fi", "esac"].includes(first.text) && this.cur.words.length === 1)) this.compoundChild = true;
    }
    const pushed = this.cur.words.length > 0 || this.cur.redirects.length > 0;
    if (pushed) {
      this.cur.child = child || this.pipedNext || this.sawCase;
      this.cur.frames = [...this.frames];
      // the operator before this command: whether it runs depends on the one before
      this.cur.sep = this.sepNext ?? ";";
      this.commands.push(this.cur);
      this.pipedNext = op === "|" || op === "|&";
    }
    if (op) this.sepNext = op;
    else if (pushed) this.sepNext = ";";
    this.cur = { words: [], redirects: [] };
  }

  addWord(w) {
    if (this.pendingRedirect) {
      this.pendingRedirect.target = w;
      this.cur.redirects.push(this.pendingRedirect);
      if (this.pendingRedirect.op === "<<" || this.pendingRedirect.op === "<<-") {
        this.pendingHeredocs.push({ delim: w.text, strip: this.pendingRedirect.op === "<<-", quoted: w.quoted });
      }
      this.pendingRedirect = null;
    } else {
      this.cur.words.push(w);
    }
  }

  run() {
    const s = this.src;
    while (this.i < s.length) {
      const c = s[this.i];
      if (this.nested && c === ")" && this.parenDepth === 0) {
        this.end = this.i;
        this.i++;
        break;
      }
      // Only space and tab separate words: the shells take `\r` as part of a word.
      if (c === " " || c === "\t") {
        this.i++;
      } else if (c === "\\" && s[this.i + 1] === "\n") {
        this.i += 2;
      } else if (c === "#") {
        while (this.i < s.length && s[this.i] !== "\n") this.i++;
      } else if (c === "\n") {
        this.i++;
        this.flush();
        this.readHeredocBodies();
      } else if (OP_CHARS.has(c) || ((c >= "0" && c <= "9") && this.redirectAhead())) {
        this.operator();
      } else {
        this.addWord(this.word());
      }
    }
    this.flush();
    if (this.nested) {
      if (this.end < 0) this.unsure.push("unbalanced $(");
      // a heredoc whose body would start after the `)`: the shells disagree on it
      if (this.pendingHeredocs.length) this.unsure.push("heredoc body outside its $( )");
      return;
    }
    if (this.pendingHeredocs.length) this.readHeredocBodies();
  }

  /** Read a `$( )`/`<( )` body with a nested lexer; this.i is just past `(`. Returns the inner text. */
  substitution() {
    const start = this.i;
    if (this.level >= MAX_NESTING) {
      this.unsure.push("substitutions nested too deep");
      this.i = this.src.length;
      return this.src.slice(start);
    }
    const sub = new Lexer(this.src, { nested: true, start, level: this.level + 1 });
    sub.run();
    this.unsure.push(...sub.unsure);
    this.i = sub.i;
    const inner = this.src.slice(start, sub.end < 0 ? this.src.length : sub.end);
    if (this.pendingHeredocs.length && inner.includes("\n")) this.unsure.push("heredoc pending across a $( ) with a newline");
    return inner;
  }

  redirectAhead() {
    // `2>file`, `2>&1`, `10<x`: digits immediately followed by < or >
    let j = this.i;
    while (j < this.src.length && this.src[j] >= "0" && this.src[j] <= "9") j++;
    return this.src[j] === "<" || this.src[j] === ">";
  }

  operator() {
    const s = this.src;
    let fd = null;
    const m = /^[0-9]+/.exec(s.slice(this.i));
    if (m) {
      fd = Number(m[0]);
      this.i += m[0].length;
    }
    const rest = s.slice(this.i, this.i + 3);
    const ops = ["&>>", "<<<", "<<-", "&&", "||", ";;", "|&", ">>", ">|", ">&", "<&", "<>", "&>", "<<", "<(", ">(", ";", "&", "|", "(", ")", "<", ">"];
    const op = ops.find((o) => rest.startsWith(o));
    this.i += op.length;
    if (op === "<(" || op === ">(") {
      const inner = this.substitution();
      this.subs.push(inner);
      this.addWord({ text: "/dev/fd/63", dynamic: true, glob: false, quoted: false, procsub: true });
      return;
    }
    if (op === "(" && this.cur.words.length === 0 && !this.pendingRedirect) {
      // subshell: its commands are classified like any others
      this.flush();
      this.parenDepth++;
      this.frames.push(++this.nextFrame);
      return;
    }
    if (op === "(" || op === ")") {
      // `f() {` function definitions and `case` patterns: flush and keep going.
      this.lastOp = op;
      if (op === "(" && /^[ \t]*\)/.test(s.slice(this.i))) {
        // a function's body runs when its name is used, later, in another
        // directory and with other arguments (`ls() { …; }; cd /elsewhere; ls`)
        this.risky.push("defines a function: its body runs later, where this classifier cannot follow it");
        this.i = s.indexOf(")", this.i) + 1;
        this.flush();
        return;
      }
      if (op === "(") {
        this.flush();
        this.parenDepth++;
        this.frames.push(++this.nextFrame);
        return;
      }
      // the command before `)` is still inside the subshell
      this.flush();
      this.parenDepth--;
      this.frames.pop();
      return;
    }
    if ([";", "&", "&&", "||", "|", "|&", ";;"].includes(op)) {
      if ((op === "|" || op === "|&" || op === "&") && !this.cur.words.length && this.lastOp === ")") this.compoundChild = true;
      this.flush(op);
      this.lastOp = op;
      return;
    }
    // redirect
    // Only a whole word that is a number or `-` duplicates a descriptor. The
    // word ends where the shells end it: space, tab, newline or an operator;
    // `\r` is part of a word, so `>&2\r#` writes a file named `2\r#`.
    const isDup = (op === ">&" || op === "<&") && /^[ \t]*(-|[0-9]+)(?![^ \t\n;&|<>()])/.test(s.slice(this.i));
    if (isDup) {
      // `2>&1`, `>&-`: fd duplication, no file
      const mm = /^[ \t]*(-|[0-9]+)/.exec(s.slice(this.i));
      this.i += mm[0].length;
      return;
    }
    let normalized = op;
    if (op === ">&") normalized = "&>";
    this.pendingRedirect = { op: normalized, fd, target: null };
    if (op === "<<<") this.pendingRedirect.herestring = true;
  }

  doubleQuoted(w) {
    // this.i is just past the opening quote
    const s = this.src;
    while (this.i < s.length && s[this.i] !== '"') {
      const c = s[this.i];
      if (c === "\\" && this.i + 1 < s.length) {
        const n = s[this.i + 1];
        if ('$`"\\\n'.includes(n)) {
          if (n !== "\n") w.text += n;
          this.i += 2;
        } else {
          w.text += c;
          this.i++;
        }
      } else if (c === "$") {
        this.dollar(w, true);
      } else if (c === "`") {
        this.i++;
        this.backtick(w, true);
      } else {
        w.text += c;
        this.i++;
      }
    }
    if (this.i >= s.length) this.unsure.push("unterminated double quote");
    this.i++; // closing quote
  }

  backtick(w, inQuotes = false) {
    const s = this.src;
    if (!inQuotes) w.split = true;
    let inner = "";
    while (this.i < s.length && s[this.i] !== "`") {
      if (s[this.i] === "\\" && this.i + 1 < s.length) {
        inner += s[this.i + 1];
        this.i += 2;
      } else inner += s[this.i++];
    }
    if (this.i >= s.length) this.unsure.push("unterminated backquote");
    this.i++;
    this.subs.push(inner);
    w.dynamic = true;
    w.text += "\u0000";
  }

  /** A `$` expansion at this.i; `inQuotes`: inside "..." or a heredoc body (no word splitting). */
  dollar(w, inQuotes = false) {
    const s = this.src;
    const n = s[this.i + 1];
    const computed = () => {
      w.dynamic = true;
      w.text += "\u0000";
      // unquoted: the shell splits the value into words and expands globs in it
      if (!inQuotes) w.split = true;
    };
    if (n === "(" && s[this.i + 2] === "(") {
      // `$((` is arithmetic only when the `(` it opens closes with `))`;
      // otherwise (`$((rm x) )`) it is a command substitution holding a subshell.
      const close = matchingParen(s, this.i + 3);
      if (close >= 0 && s[close + 1] === ")") {
        const inner = s.slice(this.i + 3, close);
        this.i = close + 2;
        if (!/^[\s0-9+\-*/%<>=!&|^~?:(),]*$/.test(inner)) this.risky.push("arithmetic on names or expansions (bash evaluates a variable's value as an expression, array subscripts and command substitutions included)");
        computed();
        return;
      }
      this.i += 2;
      this.subs.push(this.substitution());
      computed();
      return;
    }
    if (n === "(") {
      this.i += 2;
      this.subs.push(this.substitution());
      computed();
      return;
    }
    if (n === "[") {
      // bash's old `$[ ]` arithmetic (busybox: a literal `$[`)
      this.risky.push("$[ ] arithmetic (bash evaluates it)");
      w.text += "$";
      this.i++;
      return;
    }
    if (n === "{") {
      this.i += 2;
      this.parameter(w, inQuotes, computed);
      return;
    }
    if (n !== undefined && /[A-Za-z_]/.test(n)) {
      const m = /^[A-Za-z_][A-Za-z0-9_]*/.exec(s.slice(this.i + 1));
      this.i += 1 + m[0].length;
      if (m[0] === "HOME" || m[0] === "PWD") {
        w.text += "\u0001" + m[0];
        if (!inQuotes) w.splitKnown = true;
      } else computed();
      return;
    }
    if (n !== undefined && /[0-9@*#?$!-]/.test(n)) {
      this.i += 2;
      computed();
      return;
    }
    w.text += "$";
    this.i++;
  }

  /** `${...}`; this.i is just past `${`. Only the plain forms are judged harmless. */
  parameter(w, inQuotes, computed) {
    const s = this.src;
    const start = this.i;
    let depth = 0;
    let end = -1;
    while (this.i < s.length) {
      const c = s[this.i];
      if (c === "\\") {
        this.i += 2;
      } else if (c === "'") {
        if (inQuotes) {
          // inside "...", bash and ash disagree on single quotes in ${...}
          this.unsure.push("single quote inside a quoted ${...}");
          this.i++;
        } else {
          const j = s.indexOf("'", this.i + 1);
          this.i = j < 0 ? s.length : j + 1;
        }
      } else if (c === '"') {
        this.i++;
        this.doubleQuoted({ text: "", dynamic: false });
      } else if (c === "`") {
        this.i++;
        this.backtick({ text: "", dynamic: false });
      } else if (c === "$" && s[this.i + 1] === "(") {
        this.dollar({ text: "", dynamic: false }, true);
      } else if (c === "$" && s[this.i + 1] === "{") {
        this.i += 2;
        depth++;
      } else if (c === "}") {
        if (depth === 0) {
          end = this.i;
          this.i++;
          break;
        }
        depth--;
        this.i++;
      } else this.i++;
    }
    if (end < 0) {
      this.unsure.push("unterminated ${");
      computed();
      return;
    }
    const inner = s.slice(start, end);
    if (inner === "HOME" || inner === "PWD") {
      w.text += "\u0001" + inner;
      if (!inQuotes) w.splitKnown = true;
      return;
    }
    // a name, a literal index or all elements ([@], [*]): nothing evaluated
    const name = /^(?:#?(?:[A-Za-z_][A-Za-z0-9_]*(?:\[(?:[0-9]+|@|\*)\])?|[0-9]+|[@*#?$!-])?)$/;
    const op = /^([A-Za-z_][A-Za-z0-9_]*(?:\[(?:[0-9]+|@|\*)\])?|[0-9]+|[@*#?$!-])(:?[-+?]|##?|%%?|(:?=))/.exec(inner);
    if (name.test(inner)) {
      // ${x}, ${#x}, ${1}, ${#}: a value
    } else if (op && op[3] !== undefined) {
      if (!SAFE_VAR.test(op[1])) this.risky.push(`\${${op[1]}${op[3]}...} assigns ${op[1]}, which programs read`);
    } else if (!op) {
      // ${a[i]} (arithmetic subscript), ${x@P} (prompt expansion runs $( )),
      // ${!x} (indirection), ${x:n} (arithmetic offset), ${x/a/b}, ${x^}...
      this.risky.push(`\${${inner.length > 40 ? inner.slice(0, 40) + "…" : inner}} (bash evaluates parts of it: subscripts, offsets, indirection or @ operators)`);
    }
    computed();
  }

  word() {
    const s = this.src;
    const w = { text: "", dynamic: false, glob: false, quoted: false };
    const braces = [];
    while (this.i < s.length) {
      const c = s[this.i];
      if (c === " " || c === "\t" || OP_CHARS.has(c)) break;
      if (c === "\\") {
        if (s[this.i + 1] === "\n") {
          this.i += 2;
          continue;
        }
        if (this.i + 1 < s.length) w.text += s[this.i + 1];
        w.quoted = true;
        this.i += 2;
      } else if (c === "'") {
        w.quoted = true;
        const j = s.indexOf("'", this.i + 1);
        if (j < 0) {
          this.unsure.push("unterminated quote");
          w.text += s.slice(this.i + 1);
          this.i = s.length;
        } else {
          w.text += s.slice(this.i + 1, j);
          this.i = j + 1;
        }
      } else if (c === "$" && s[this.i + 1] === "'") {
        w.quoted = true;
        this.i += 2;
        while (this.i < s.length && s[this.i] !== "'") {
          if (s[this.i] === "\\" && this.i + 1 < s.length) {
            const e = s[this.i + 1];
            const map = { n: "\n", t: "\t", r: "\r", "\\": "\\", "'": "'", '"': '"', a: "\u0007", e: "\u001b", "0": "\u0000" };
            if (e in map) {
              w.text += map[e];
              this.i += 2;
            } else {
              // \xHH and friends: content unknown to us
              w.dynamic = true;
              w.text += "\u0000";
              this.i += 2;
            }
          } else w.text += s[this.i++];
        }
        this.i++;
      } else if (c === '"') {
        w.quoted = true;
        this.i++;
        this.doubleQuoted(w);
      } else if (c === "$") {
        this.dollar(w);
      } else if (c === "`") {
        this.i++;
        this.backtick(w);
      } else {
        if (c === "*" || c === "?" || c === "[") w.glob = true;
        // brace expansion (bash): `{a,-o}` or `{1..3}` becomes several words
        if (c === "{") braces.push({ at: w.text.length, list: false });
        else if ((c === "," || (c === "." && s[this.i + 1] === ".")) && braces.length) braces[braces.length - 1].list = true;
        else if (c === "}" && braces.length && braces.pop().list) {
          w.glob = true;
          w.brace = true;
        }
        w.text += c;
        this.i++;
      }
    }
    if (this.nested && !w.quoted && w.text === "case") this.unsure.push("case inside $( )");
    if (!w.quoted && w.text === "case") this.sawCase = true; // its `)` are patterns, not subshell ends
    return w;
  }

  readHeredocBodies() {
    const s = this.src;
    while (this.pendingHeredocs.length) {
      const hd = this.pendingHeredocs.shift();
      let body = "";
      for (;;) {
        if (this.i >= s.length) {
          if (body.length || hd.delim) this.unsure.push(`heredoc ${hd.delim} not terminated`);
          break;
        }
        let j = s.indexOf("\n", this.i);
        if (j < 0) j = s.length;
        let line = s.slice(this.i, j);
        this.i = Math.min(j + 1, s.length);
        const cmp = hd.strip ? line.replace(/^\t+/, "") : line;
        if (cmp === hd.delim) break;
        body += line + "\n";
        line = null;
      }
      if (!hd.quoted) {
        // unquoted heredoc: the body is expanded like "...": substitutions run
        const tmp = new Lexer(body, { level: this.level });
        const w = { text: "", dynamic: false };
        while (tmp.i < body.length) {
          const c = body[tmp.i];
          if (c === "\\") tmp.i += 2;
          else if (c === "$") tmp.dollar(w, true);
          else if (c === "`") {
            tmp.i++;
            tmp.backtick(w, true);
          } else tmp.i++;
        }
        this.subs.push(...tmp.subs);
        this.risky.push(...tmp.risky);
        this.unsure.push(...tmp.unsure);
      }
    }
  }
}

/**
 * Index of the `)` that closes a `(` whose inside starts at `start`
 * (quotes and backslashes respected), or -1. How bash decides whether `$((`
 * opens arithmetic: only when this `)` is followed by another `)`.
 */
function matchingParen(s, start) {
  let depth = 1;
  for (let j = start; j < s.length; j++) {
    const c = s[j];
    if (c === "\\") j++;
    else if (c === "'") {
      const k = s.indexOf("'", j + 1);
      if (k < 0) return -1;
      j = k;
    } else if (c === '"') {
      let k = j + 1;
      while (k < s.length && s[k] !== '"') k += s[k] === "\\" ? 2 : 1;
      if (k >= s.length) return -1;
      j = k;
    } else if (c === "(") depth++;
    else if (c === ")" && --depth === 0) return j;
  }
  return -1;
}

// ---------------------------------------------------------------------------
// Command tables

// The read-only allowlist lives in ./readonly.js (SPECS): exact options only.
const READ_ONLY = new Set(Object.keys(SPECS));

// Variables a command line may set without asking: shell-local names (starting
// lower-case) and a few that only change formatting. Upper-case names are read
// by programs (PATH, LD_PRELOAD, BASH_ENV, GIT_*, RIPGREP_CONFIG_PATH, PAGER...)
// and can make a "read" run code.
const SAFE_VAR = /^(?:[a-z_][A-Za-z0-9_]*|LC_[A-Z]+|LANG|LANGUAGE|TZ|COLUMNS|LINES|NO_COLOR|FORCE_COLOR|TERM|CI|PYTHONUNBUFFERED|PYTHONDONTWRITEBYTECODE|DEBIAN_FRONTEND)$/;
// Command directories whose programs the tables describe; `./ls` or `/mnt/work/bin/cat` is some other program.
const SYSTEM_BIN = new Set(["/bin", "/usr/bin", "/usr/local/bin", "/sbin", "/usr/sbin", "/usr/local/sbin", "/opt/piwork/bin"]);
// Builtins that assign the variables their arguments name.
const DECLARE = new Set(["export", "declare", "typeset", "local", "readonly"]);

// `NAME=`, `NAME+=`, `NAME[i]=`: a variable assignment before a command (or alone)
const ASSIGNMENT = /^[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?\+?=/;
/** obj[key] if obj has it as its own property: a command's name is never looked up on Object.prototype. */
const own = (obj, key) => (Object.hasOwn(obj, key) ? obj[key] : undefined);
// Keywords that may prefix a command and are otherwise no-ops for us.
const KEYWORDS = new Set(["if", "then", "else", "elif", "fi", "do", "done", "while", "until", "!", "{", "}", "esac", "time", "in"]);

// Wrappers: the real command follows (after the wrapper's own options).
const WRAPPERS = {
  nice: { opts: ["-n="], longOpts: ["--adjustment="] },
  nohup: {},
  time: { opts: ["-p"] },
  command: { opts: ["-p"] },
  builtin: {},
  exec: {},
  stdbuf: { opts: ["-i=", "-o=", "-e="], longOpts: ["--input=", "--output=", "--error="] },
  ionice: { opts: ["-c=", "-n=", "-t"], longOpts: ["--class=", "--classdata=", "--ignore"] },
  timeout: { positional: 1, opts: ["-s=", "-k=", "-v"], longOpts: ["--signal=", "--kill-after=", "--preserve-status", "--foreground", "--verbose"] },
  // no -S/--split-string (runs a string), no -C/--chdir (moves the command elsewhere)
  env: { opts: ["-i", "-0", "-u="], longOpts: ["--ignore-environment", "--null", "--unset="], assignments: true },
  xargs: { opts: ["-0", "-r", "-t", "-x", "-I=", "-n=", "-P=", "-L=", "-s=", "-d=", "-E=", "-a="], longOpts: ["--null", "--no-run-if-empty", "--verbose", "--exit", "--max-args=", "--max-procs=", "--max-lines=", "--max-chars=", "--delimiter=", "--arg-file="], unknownArgs: true },
  setsid: { opts: ["-f", "-w", "-c"], longOpts: ["--fork", "--wait", "--ctty"] },
  unbuffer: {},
};
const PRIV_WRAPPERS = {
  sudo: { opts: ["-u=", "-g=", "-C=", "-D=", "-h=", "-p=", "-r=", "-t=", "-U=", "-T=", "-E", "-H", "-n", "-S", "-b", "-k", "-P"] },
  doas: { opts: ["-u=", "-C=", "-n", "-s"] },
  su: {},
  runuser: { opts: ["-u=", "-g=", "-l"] },
  pkexec: { longOpts: ["--user="] },
};
const SHELLS = new Set(["bash", "sh", "zsh", "dash", "ksh", "ash", "fish", "busybox"]);
const INTERPRETERS = new Set(["python", "python3", "python2", "node", "nodejs", "deno", "bun", "perl", "ruby", "php", "lua", "Rscript", "osascript", "pwsh", "tclsh"]);

const NETWORK_TOOLS = {
  curl: null, wget: null, aria2c: null, http: null, https: null, httpie: null, xh: null,
  ssh: null, scp: null, sftp: null, rsync: null, ftp: null, lftp: null, telnet: null,
  nc: null, ncat: null, netcat: null, socat: null, ping: null, dig: null, nslookup: null,
  host: null, whois: null, traceroute: null, mosh: null,
};

// Package managers: subcommands that reach the network, and the default domain.
const PACKAGE_MANAGERS = {
  pip: { subs: ["install", "download", "wheel", "index", "search"], domain: "pypi.org" },
  pip3: { subs: ["install", "download", "wheel", "index", "search"], domain: "pypi.org" },
  pipx: { subs: ["install", "run", "upgrade", "inject"], domain: "pypi.org" },
  uv: { subs: ["add", "sync", "lock", "run", "tool", "pip", "venv", "python"], domain: "pypi.org" },
  uvx: { subs: ["*"], domain: "pypi.org" },
  poetry: { subs: ["add", "install", "update", "lock", "publish", "self"], domain: "pypi.org" },
  pdm: { subs: ["add", "install", "update", "lock", "sync"], domain: "pypi.org" },
  conda: { subs: ["install", "create", "update", "env"], domain: "conda.anaconda.org" },
  mamba: { subs: ["install", "create", "update", "env"], domain: "conda.anaconda.org" },
  npm: { subs: ["install", "i", "ci", "add", "update", "upgrade", "up", "publish", "exec", "x", "create", "init", "dlx", "audit", "outdated", "view", "info", "pack", "login", "whoami"], domain: "registry.npmjs.org" },
  npx: { subs: ["*"], domain: "registry.npmjs.org" },
  pnpm: { subs: ["install", "i", "add", "update", "up", "dlx", "create", "publish", "fetch", "outdated"], domain: "registry.npmjs.org" },
  pnpx: { subs: ["*"], domain: "registry.npmjs.org" },
  yarn: { subs: ["", "install", "add", "upgrade", "up", "dlx", "create", "publish", "global"], domain: "registry.yarnpkg.com" },
  bun: { subs: ["install", "i", "add", "update", "x", "create", "publish"], domain: "registry.npmjs.org" },
  bunx: { subs: ["*"], domain: "registry.npmjs.org" },
  cargo: { subs: ["install", "add", "fetch", "update", "publish", "search", "build", "run", "test", "check", "b", "r", "t"], domain: "crates.io" },
  go: { subs: ["get", "install", "mod", "run", "build", "test"], domain: "proxy.golang.org" },
  gem: { subs: ["install", "update", "fetch", "push"], domain: "rubygems.org" },
  bundle: { subs: ["", "install", "update", "add"], domain: "rubygems.org" },
  composer: { subs: ["install", "require", "update", "create-project"], domain: "packagist.org" },
  apt: { subs: ["install", "update", "upgrade", "full-upgrade", "dist-upgrade", "download", "source"], domain: "deb.debian.org" },
  "apt-get": { subs: ["install", "update", "upgrade", "dist-upgrade", "download", "source", "build-dep"], domain: "deb.debian.org" },
  apk: { subs: ["add", "update", "upgrade", "fetch"], domain: "dl-cdn.alpinelinux.org" },
  dnf: { subs: ["install", "update", "upgrade", "download"], domain: "mirrors.fedoraproject.org" },
  yum: { subs: ["install", "update", "upgrade"], domain: "mirrorlist.centos.org" },
  pacman: { subs: ["-S", "-Sy", "-Syu", "-Syy"], domain: "archlinux.org" },
  brew: { subs: ["install", "upgrade", "update", "tap", "fetch"], domain: "formulae.brew.sh" },
  docker: { subs: ["pull", "push", "run", "build", "login"], domain: "registry-1.docker.io" },
  podman: { subs: ["pull", "push", "run", "build", "login"], domain: "registry-1.docker.io" },
  huggingface_cli: { subs: ["download", "upload", "login"], domain: "huggingface.co" },
  "huggingface-cli": { subs: ["download", "upload", "login"], domain: "huggingface.co" },
};

// Options that take a separate argument, per command (so the argument is not taken for a path).
const OPTS_WITH_ARG = {
  head: ["-n", "-c", "--lines", "--bytes"],
  tail: ["-n", "-c", "--lines", "--bytes", "-s", "--pid"],
  grep: ["-e", "-f", "-m", "-A", "-B", "-C", "-d", "-D", "--regexp", "--file", "--max-count", "--context", "--include", "--exclude", "--exclude-dir", "--label"],
  egrep: ["-e", "-f", "-m", "-A", "-B", "-C"],
  fgrep: ["-e", "-f", "-m", "-A", "-B", "-C"],
  zgrep: ["-e", "-f", "-m", "-A", "-B", "-C"],
  rg: ["-e", "-f", "-m", "-A", "-B", "-C", "-g", "--glob", "-t", "--type", "-T", "--type-not", "--max-depth", "-d", "-M", "-j", "--sort", "-r", "--replace", "--iglob", "--max-count", "--context"],
  ag: ["-A", "-B", "-C", "-G", "--ignore", "-m", "--depth"],
  ls: ["-I", "--ignore", "-w", "--width", "-T", "--tabsize", "--sort", "--format", "--time-style", "--color"],
  tree: ["-L", "-I", "-P", "--filelimit", "-o"],
  du: ["-d", "--max-depth", "-B", "--block-size", "--exclude", "-t", "--threshold"],
  cut: ["-d", "-f", "-c", "-b", "--delimiter", "--fields", "--output-delimiter"],
  sort: ["-k", "-t", "-o", "-S", "-T", "--key", "--field-separator", "--output", "--buffer-size", "--parallel"],
  uniq: ["-f", "-s", "-w"],
  wc: ["--files0-from"],
  nl: ["-b", "-d", "-f", "-h", "-i", "-n", "-s", "-v", "-w"],
  diff: ["-U", "-C", "-x", "-X", "--exclude", "-I", "-F", "--label", "-L"],
  xxd: ["-c", "-g", "-l", "-s", "-o"],
  od: ["-A", "-j", "-N", "-t", "-w"],
  hexdump: ["-n", "-s", "-e", "-f"],
  jq: ["--arg", "--argjson", "--slurpfile", "--rawfile", "--indent", "-L", "-f"],
  column: ["-s", "-t", "-c", "-o", "-N"],
  fd: ["-e", "-E", "-t", "-d", "--max-depth", "--exclude", "--extension", "--type", "-x", "-X", "-j", "-S", "--owner", "--changed-within", "--changed-before"],
  fdfind: ["-e", "-E", "-t", "-d", "--max-depth", "--exclude", "--extension", "--type", "-x", "-X", "-j"],
  cp: ["-t", "--target-directory", "-S", "--suffix"],
  ln: ["-t", "--target-directory", "-S", "--suffix"],
  install: ["-t", "--target-directory", "-S", "--suffix", "-m", "--mode", "-o", "--owner", "-g", "--group"],
  rsync: ["-e", "--rsh", "--exclude", "--include", "--filter", "-f", "--files-from", "--exclude-from", "--include-from", "--chmod", "--port", "--timeout", "-T", "--temp-dir", "--backup-dir", "--suffix", "--log-file", "--partial-dir", "--max-size", "--min-size", "--bwlimit"],
  scp: ["-P", "-i", "-F", "-o", "-l", "-c", "-S", "-J"],
  touch: ["-d", "-t", "-r", "--date", "--reference"],
  mkdir: ["-m", "--mode", "--context"],
  chmod: ["--reference"],
  chown: ["--reference", "--from"],
  chgrp: ["--reference"],
  split: ["-l", "-b", "-C", "-n", "-a", "--additional-suffix", "-t"],
  csplit: ["-f", "-b", "-n", "--prefix", "--suffix-format"],
  patch: ["-i", "--input", "-o", "--output", "-d", "--directory", "-r", "--reject-file", "-B", "-D", "-F", "-V", "-Y", "-z"],
  tee: [],
  truncate: ["-s", "--size", "-r", "--reference"],
  mv: ["-t", "--target-directory", "-S", "--suffix"],
  rm: [],
  shred: ["-n", "--iterations", "-s", "--size", "--random-source"],
};
function optsFor(name) {
  return new Set(own(OPTS_WITH_ARG, name) ?? []);
}

const GIT_NETWORK = new Set(["clone", "fetch", "pull", "push", "ls-remote", "submodule", "remote", "archive", "request-pull", "send-email", "lfs"]);
const GIT_READ = new Set(["status", "log", "diff", "show", "rev-parse", "ls-files", "ls-tree", "blame", "grep", "describe", "shortlog", "cat-file", "rev-list", "whatchanged", "reflog", "name-rev", "merge-base", "for-each-ref", "show-ref", "check-ignore", "help", "version", "--version"]);
const GIT_DESTRUCTIVE = new Set(["clean", "rm"]);
const GIT_GLOBAL_OPTS_WITH_ARG = new Set(["-C", "-c", "--git-dir", "--work-tree", "--namespace", "--exec-path", "--config-env"]);
const GIT_GLOBAL_FLAGS = new Set(["-C", "-P", "--no-pager", "--no-replace-objects", "--literal-pathspecs", "--glob-pathspecs", "--noglob-pathspecs", "--icase-pathspecs", "--no-optional-locks", "--no-lazy-fetch", "--bare", "--version", "--help"]);

// /dev/stdout, /dev/fd/N...: paths that name a descriptor of the shell itself.
const FD_PATHS = /^\/dev\/(?:std(?:in|out|err)|fd\/[0-9]+)$/;

const DEV_PATHS = new Set(["/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty", "/dev/zero", "/dev/random", "/dev/urandom", "/dev/fd/0", "/dev/fd/1", "/dev/fd/2", "/dev/fd/63"]);

// ---------------------------------------------------------------------------
// Classification

/** Effect = { op, action?, path?, raw?, domain?, command, reason, unknownTarget? } */

function effect(op, fields) {
  return { op, ...fields };
}

function wordValue(w, ctx) {
  // HOME/PWD markers expand; any other dynamic part makes the value unknown.
  if (w.dynamic) return null;
  return w.text.replace(/\u0001HOME/g, ctx.home).replace(/\u0001PWD/g, ctx.cwd ?? "/");
}

function globBase(text) {
  // `src/*.o` -> `src`; `*.o` -> `.`
  const idx = text.search(/[*?[{]/);
  if (idx < 0) return text;
  const slash = text.lastIndexOf("/", idx);
  if (slash < 0) return ".";
  return text.slice(0, slash) || "/";
}

function segmentText(words) {
  return words
    .map((w) => (w.dynamic ? w.text.replace(/\u0000/g, "$…").replace(/\u0001/g, "$") : w.text.replace(/\u0001/g, "$")))
    .map(shellQuote)
    .join(" ");
}

export function shellQuote(s) {
  if (s === "") return "''";
  if (/^[A-Za-z0-9_@%+=:,./…$-]+$/.test(s)) return s;
  return "'" + s.replace(/'/g, "'\\''") + "'";
}

function pathEffect(op, w, ctx, command, reason) {
  // A word that names a path: resolve it later (needs ctx.cwd which may change).
  if (w == null) return effect(op, { raw: null, cwd: ctx.cwd, command, reason, unknownTarget: true });
  if (op !== "read" && ctx.line?.linksMade) {
    // `tar -xf t.tar && echo x > link/f`: the link did not exist when this was judged
    return effect(op, { raw: w.text.replace(/[\u0000\u0001]/g, "$"), cwd: ctx.cwd, command, reason: `${reason}, after a command on this line that may have made symbolic links on the way`, unknownTarget: true });
  }
  const v = wordValue(w, ctx);
  if (v === null) return effect(op, { raw: w.text.replace(/[\u0000\u0001]/g, "$"), cwd: ctx.cwd, command, reason, unknownTarget: true });
  if (w.glob) return effect(op, { raw: globBase(v), glob: v, cwd: ctx.cwd, command, reason });
  return effect(op, { raw: v, cwd: ctx.cwd, command, reason });
}

function positionals(words, optsWithArg = new Set()) {
  // words after the command name that are not options; `--` ends options
  const out = [];
  let endOpts = false;
  for (let i = 1; i < words.length; i++) {
    const w = words[i];
    const t = w.text;
    if (!endOpts && !w.quoted && t === "--") {
      endOpts = true;
      continue;
    }
    if (!endOpts && t.startsWith("-") && t.length > 1 && !w.quoted) {
      if (optsWithArg.has(t)) i++;
      continue;
    }
    out.push(w);
  }
  return out;
}

function hasFlag(words, ...flags) {
  return words.slice(1).some((w) => {
    const t = w.text;
    if (flags.includes(t)) return true;
    // combined short flags: -rf contains -r
    if (/^-[A-Za-z]+$/.test(t)) return flags.some((f) => /^-[A-Za-z]$/.test(f) && t.includes(f[1]));
    return false;
  });
}

function urlDomains(words) {
  const domains = [];
  for (const w of words) {
    const t = w.text;
    let m = /^[a-z][a-z0-9+.-]*:\/\/(?:[^@/\s]*@)?(\[[^\]]+\]|[^/:?#\s]+)/i.exec(t);
    if (m) {
      domains.push(m[1].toLowerCase());
      continue;
    }
    m = /^(?:[^@/\s]+@)([A-Za-z0-9.-]+):/.exec(t); // git@github.com:owner/repo
    if (m) {
      domains.push(m[1].toLowerCase());
      continue;
    }
    m = /^(?:[^@/\s]+@)?([A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)(?::|$)/.exec(t); // host.tld, user@host, host:path
    if (m && !t.startsWith("-") && !t.startsWith("/") && !t.startsWith(".") && /[a-z]/i.test(m[1].split(".").pop())) {
      if (!/\.(txt|json|md|py|js|ts|sh|tar|gz|zip|log|csv|html|yml|yaml|toml|lock)$/i.test(m[1])) domains.push(m[1].toLowerCase());
    }
  }
  return unique(domains);
}

function netEffects(words, command, reason, fallbackDomain) {
  let domains = urlDomains(words.slice(1));
  if (domains.length === 0 && fallbackDomain) domains = [fallbackDomain];
  if (domains.length === 0) return [effect("network", { domain: null, command, reason, unknownTarget: true })];
  return domains.map((d) => effect("network", { domain: d, command, reason }));
}

/**
 * Can this command create a symbolic link whose target the classifier never
 * sees: an archive's, a copied or moved relative link that now points
 * elsewhere, a checkout's? A rough look at its words: an unusual spelling
 * errs on the side of "yes".
 */
function makesLinks(words) {
  const texts = words.filter((w) => !w.dynamic).map((w) => w.text);
  const at = texts.findIndex((t) => ["tar", "bsdtar", "unzip", "cpio", "7z", "cp", "rsync", "git", "ln", "mv", "patch"].includes(path.basename(t)));
  if (at < 0) return false;
  const name = path.basename(texts[at]);
  const rest = texts.slice(at + 1);
  const short = (letters) => rest.some((t) => new RegExp(`^-[A-Za-z]*[${letters}]`).test(t) && !t.startsWith("--"));
  if (name === "cp") return short("adPRrs") || rest.some((t) => /^--(archive|no-dereference|preserve|recursive|symbolic-link)/.test(t));
  if (name === "rsync") return short("alr") || rest.some((t) => /^--(archive|links|recursive)/.test(t));
  if (name === "tar" || name === "bsdtar") {
    // option clusters: `-xzf`, or the first word in the old style (`xzf`)
    const clusters = rest.filter((t, i) => (t.startsWith("-") && !t.startsWith("--")) || (i === 0 && /^[A-Za-z]+$/.test(t))).map((t) => t.replace(/^-/, ""));
    const extracts = clusters.some((c) => c.includes("x")) || rest.some((t) => /^--(extract|get)$/.test(t));
    const onlyReadsOrPacks = clusters.some((c) => /[ct]/.test(c)) || rest.some((t) => /^--(create|list)$/.test(t));
    return extracts || !onlyReadsOrPacks;
  }
  if (name === "git") return !GIT_READ.has(rest.find((t) => !t.startsWith("-")) ?? "");
  return true;
}

/**
 * Classify one simple command (already split by the lexer).
 * `ctx` = { cwd, home, depth, line } and is mutated by `cd`; `ctx.line` is
 * shared by everything on the tool call's command line.
 */
function classifySimple(cmd, ctx, effects) {
  classifySimpleCommand(cmd, ctx, effects);
  // later writes on this line may go through a link this one made
  if (ctx.line && makesLinks(cmd.words)) ctx.line.linksMade = true;
}

function classifySimpleCommand(cmd, ctx, effects) {
  // process substitutions were classified as their own commands
  let words = cmd.words.filter((w) => !w.procsub);
  const command0 = segmentText(cmd.words);

  // redirects first: they apply whatever the command is
  for (const r of cmd.redirects) {
    if (r.op === "<<" || r.op === "<<-" || r.herestring) continue;
    if (r.target && r.target.procsub) continue;
    const val = r.target ? wordValue(r.target, ctx) : null;
    if (val !== null && DEV_PATHS.has(val)) {
      // Writing to /dev/fd/N or /dev/stdout *reopens* what that descriptor refers
      // to: after `exec 3<a.txt` (or `< a.txt` on the same command) that is a.txt,
      // opened for writing and truncated. Harmless only when nothing in the
      // command line can have pointed a descriptor at a file.
      const output = r.op !== "<";
      if (output && ctx.fdRisk && FD_PATHS.test(val)) effects.push(effect("write", { raw: null, cwd: ctx.cwd, command: command0, reason: `writes to ${val}, which reopens the file a descriptor may have been pointed at by a redirect`, unknownTarget: true }));
      continue;
    }
    if (r.op !== "<" && ctx.fdRisk && val !== null && /^\/dev\/stdin$/.test(val)) {
      effects.push(effect("write", { raw: null, cwd: ctx.cwd, command: command0, reason: `writes to ${val}, which reopens the file a descriptor may have been pointed at by a redirect`, unknownTarget: true }));
      continue;
    }
    if (r.op === "<") effects.push(pathEffect("read", r.target, ctx, command0, "reads input from a file"));
    else if (r.op === "<>") effects.push(pathEffect("write", r.target, ctx, command0, "opens a file for writing"));
    else if (r.op === ">>" || r.op === "&>>") effects.push(pathEffect("write", r.target, ctx, command0, "appends to a file"));
    else {
      // > >| &> : create or truncate. With no command at all it only truncates.
      const bare = words.length === 0 || (words.length === 1 && [":", "true"].includes(words[0].text));
      if (bare) effects.push(pathEffect("delete", r.target, ctx, command0, "truncates a file to zero length"));
      else effects.push(pathEffect("write", r.target, ctx, command0, "writes (overwrites) a file"));
    }
  }

  // leading assignments and keywords
  while (words.length && (KEYWORDS.has(words[0].text) && !words[0].quoted)) words.shift();
  while (words.length && ASSIGNMENT.test(words[0].text) && !words[0].text.startsWith("=")) {
    const bad = unsafeAssignment(words[0].text);
    if (bad) effects.push(effect("exec", { command: command0, reason: bad }));
    words.shift();
  }
  if (words.length === 0) return;
  if ((words[0].text === "for" || words[0].text === "select") && words[1]) {
    // the loop assigns its variable: `for PATH in .; do ls; done` runs ./ls
    const bad = words[1].dynamic ? "a loop over a computed variable name" : unsafeAssignment(`${words[1].text}=`);
    if (bad) effects.push(effect("exec", { command: command0, reason: bad }));
    return; // loop header; the body is its own segment
  }
  if (words[0].text === "case") return;
  if (words[0].text === "function" && !words[0].quoted) {
    effects.push(effect("exec", { command: command0, reason: "defines a function: its body runs later, where this classifier cannot follow it" }));
    return;
  }

  const name0 = words[0].dynamic ? null : path.basename(words[0].text);
  const command = segmentText(words);
  if (name0 === null) {
    effects.push(effect("exec", { command, reason: "runs a command whose name is computed at run time" }));
    return;
  }
  const name = name0;
  if (words[0].text.includes("/") && !SYSTEM_BIN.has(path.posix.dirname(wordValue(words[0], ctx) ?? "."))) {
    effects.push(effect("exec", { command, reason: `runs the program ${words[0].text} (not a known system command)` }));
    return;
  }

  // privilege wrappers: classify what they run, and flag the elevation
  if (Object.hasOwn(PRIV_WRAPPERS, name)) {
    effects.push(effect("exec", { command, reason: `runs a command as another user (${name})` }));
    const inner = unwrap(words, PRIV_WRAPPERS[name], ctx);
    if (name === "su") {
      const ci = words.findIndex((w) => w.text === "-c" || w.text === "--command");
      if (ci >= 0 && words[ci + 1]) recurseString(words[ci + 1], ctx, effects, command);
      return;
    }
    if (inner.length) classifyChild({ words: inner, redirects: [] }, ctx, effects);
    return;
  }
  if ((name === "command" || name === "type" || name === "hash") && words.slice(1).some((w) => w.text === "-v" || w.text === "-V")) return;
  if (Object.hasOwn(WRAPPERS, name)) {
    const spec = WRAPPERS[name];
    const inner = unwrap(words, spec, ctx);
    if (inner === null) {
      effects.push(effect("exec", { command, reason: `${name} with an option whose effect is not known` }));
      return;
    }
    if (spec.assignments) {
      const own = words.slice(1, words.length - inner.length);
      for (let k = 0; k < own.length; k++) {
        const t = own[k].text;
        const bad = /^[A-Za-z_][A-Za-z0-9_]*=/.test(t) ? unsafeAssignment(t) : null;
        if (bad) effects.push(effect("exec", { command, reason: bad }));
        // `env -u PATH cmd`: the command is then looked up in a default path
        const unset = t === "-u" || t === "--unset" ? own[k + 1]?.text : /^(?:-u|--unset=)(.+)$/.exec(t)?.[1];
        const badUnset = unset === undefined ? null : unsafeAssignment(`${unset}=`);
        if (badUnset) effects.push(effect("exec", { command, reason: badUnset.replace(/^sets /, "unsets ") }));
      }
    }
    if (inner.length === 0) return; // plain `env`, `time`: prints
    if (spec.unknownArgs) {
      // xargs rm: the targets come from stdin
      const innerCmd = { words: inner, redirects: [] };
      const sub = [];
      classifyChild(innerCmd, ctx, sub);
      const innerName = path.basename(inner[0].text);
      const looksReadOnly = sub.every((e) => e.op === "read") && READ_ONLY.has(innerName) && !inner[0].text.includes("/");
      if (!looksReadOnly) {
        for (const e of sub) effects.push(e);
        const op = ["rm", "rmdir", "unlink", "shred"].includes(innerName) ? "delete" : ["mv"].includes(innerName) ? "move" : "exec";
        effects.push(effect(op, { raw: null, cwd: ctx.cwd, command, reason: `${name} passes arguments from its input to ${innerName}`, unknownTarget: true }));
      } else {
        for (const e of sub) effects.push(e);
        // the files it reads come from its input: not known to be in scope
        if (SPECS[innerName]?.pos !== "none") effects.push(effect("read", { raw: null, cwd: ctx.cwd, command, reason: `${name} passes file names from its input to ${innerName}`, unknownTarget: true }));
      }
      return;
    }
    // `builtin cd`, `command cd` (and bash's `time` keyword) run in this shell
    if (["builtin", "command", "time"].includes(name)) classifySimple({ words: inner, redirects: [], sep: cmd.sep }, ctx, effects);
    else classifyChild({ words: inner, redirects: [] }, ctx, effects);
    return;
  }

  // shells and eval: classify the string they run
  if (SHELLS.has(name) || name === "eval") {
    if (name === "eval") {
      const rest = words.slice(1);
      if (rest.some((w) => w.dynamic)) {
        effects.push(effect("exec", { command, reason: "evaluates a computed string" }));
        return;
      }
      recurseString({ text: rest.map((w) => w.text).join(" "), dynamic: false }, ctx, effects, command, { sameShell: true });
      return;
    }
    const ci = words.findIndex((w, idx) => idx > 0 && !w.quoted && /^-[A-Za-z]*c[A-Za-z]*$/.test(w.text));
    if (ci >= 0 && words[ci + 1]) {
      recurseString(words[ci + 1], ctx, effects, command);
      return;
    }
    const script = positionals(words)[0];
    if (script) {
      effects.push(pathEffect("read", script, ctx, command, "reads a script"));
      effects.push(effect("exec", { command, reason: "runs a shell script (its effects are not inspected)" }));
    } else {
      effects.push(effect("exec", { command, reason: "runs a shell reading commands from its input" }));
    }
    return;
  }
  if (name === "source" || name === ".") {
    const script = positionals(words)[0];
    if (script) effects.push(pathEffect("read", script, ctx, command, "reads a script"));
    effects.push(effect("exec", { command, reason: "runs a shell script in the current shell" }));
    return;
  }

  if ((name === "cd" || name === "pushd" || name === "popd") && (cmd.child || ctx.compoundChild)) {
    // in a pipeline or the background (or among case patterns): it moves that
    // child (and what runs after it there), not this shell. Which commands
    // share that child is not followed: the directory becomes unknown.
    ctx.cwd = null;
    return;
  }
  if (name === "popd") {
    ctx.cwd = null; // back to a directory this classifier may not know
    return;
  }
  // cd: update the virtual cwd
  if (name === "cd" || name === "pushd") {
    const before = ctx.cwd;
    const target = positionals(words)[0];
    // pushd with no directory, or +N/-N, rotates the stack: a directory this
    // classifier may not know
    if (name === "pushd" && (!target || words.slice(1).some((w) => /^[-+][0-9]+$/.test(w.text)))) ctx.cwd = null;
    else if (!target) ctx.cwd = ctx.home;
    else {
      const v = wordValue(target, ctx);
      if (v === null || v === "-") ctx.cwd = null;
      else if (ctx.cwd === null && !path.isAbsolute(v) && !v.startsWith("~")) ctx.cwd = null;
      else ctx.cwd = resolvePath(v, ctx.cwd ?? "/", { home: ctx.home });
    }
    noteUncertainCd(cmd, ctx, before);
    return;
  }

  // Commands whose options can run programs: a write only when every option
  // is known not to (./writes.js), and no word may split into new options.
  if (isKnownWrite(name) || name === "patch" || name === "7z") {
    const checked = writeRisk(name, words, ctx);
    if (checked.reason) {
      effects.push(effect("exec", { command, reason: checked.reason }));
      return;
    }
    // option arguments that name where it writes (tar --file=X, -C X, unzip -dX)
    for (const f of checked.files) effects.push(pathEffect(f.op, f.word, ctx, command, f.reason));
  } else if (FILE_CHANGERS.has(name)) {
    // no option of these runs a program, but a word that becomes options can
    // move the target: `cp * x` with a file named `-t..` copies into the parent
    const split = firstSplit(words, ctx) ?? words.slice(1).find((w) => w.glob && mayBeOption(w, ctx));
    if (split) {
      effects.push(effect("exec", { command, reason: splitReason(name, split) }));
      return;
    }
  }

  // deletes
  if (name === "rm" || name === "rmdir" || name === "unlink" || name === "shred" || name === "srm") {
    const targets = positionals(words, optsFor(name));
    const why = name === "rm" && hasFlag(words, "-r", "-R", "--recursive") ? "deletes recursively" : "deletes";
    if (name === "shred" && !hasFlag(words, "-u", "--remove")) {
      for (const t of targets) effects.push(pathEffect("delete", t, ctx, command, "overwrites file contents (shred)"));
    } else {
      for (const t of targets) effects.push(pathEffect("delete", t, ctx, command, why));
    }
    if (targets.length === 0) effects.push(effect("exec", { command, reason: `${name} with no target` }));
    return;
  }
  if (name === "truncate") {
    for (const t of positionals(words, optsFor("truncate"))) effects.push(pathEffect("delete", t, ctx, command, "truncates a file"));
    return;
  }
  if (name === "find") {
    classifyFind(words, ctx, effects, command);
    return;
  }

  // moves
  if (name === "mv" || name === "rename" || name === "prename" || name === "file-rename") {
    let pos = positionals(words, optsFor("mv"));
    const target = targetDirectory(words);
    if (name !== "mv") pos = pos.slice(1); // rename EXPR files...
    for (const t of pos) effects.push(pathEffect("move", t, ctx, command, name === "mv" ? "moves or renames" : "renames"));
    if (target) effects.push(pathEffect("move", target, ctx, command, "moves into"));
    return;
  }

  // writes
  if (name === "cp" || name === "ln" || name === "install" || name === "rsync" || name === "scp") {
    const pos = positionals(words, optsFor(name));
    const target = targetDirectory(words);
    const tIdx = target ? 0 : -1;
    if (name === "rsync" || name === "scp") {
      const remote = pos.filter((w) => /^[^/]*[^/\\]:/.test(w.text) && !/^[A-Za-z]:\\/.test(w.text));
      if (remote.length || pos.some((w) => /^rsync:\/\//.test(w.text))) {
        for (const e of netEffects([words[0], ...remote.map((w) => ({ ...w, text: w.text.startsWith("rsync://") ? w.text : "ssh://" + w.text.split(":")[0] }))], command, `${name} transfers over the network`)) effects.push(e);
      }
      const local = pos.filter((w) => !remote.includes(w));
      if (name === "rsync" && hasFlag(words, "--delete", "--delete-after", "--delete-before", "--delete-during", "--remove-source-files")) {
        const dst = local[local.length - 1];
        if (dst) effects.push(pathEffect("delete", dst, ctx, command, "rsync --delete removes files at the destination"));
      }
      pos.length = 0;
      pos.push(...local);
    }
    const dest = target ?? pos[pos.length - 1];
    const sources = tIdx >= 0 ? pos : pos.slice(0, -1);
    // `ln -s`: a relative target is relative to the link's directory, not the cwd
    // (`cd a/b && ln -s .. ../../up` makes /mnt/work/up -> /mnt). Judge where the
    // link will point; the link dir is DEST when it is a directory, else its parent.
    const symbolic = name === "ln" && hasFlag(words, "-s", "--symbolic") && !hasFlag(words, "-r", "--relative");
    for (const s of sources) {
      if (!symbolic || !dest || s.text.startsWith("/") || s.glob) {
        effects.push(pathEffect("read", s, ctx, command, "reads"));
        continue;
      }
      const dirs = tIdx >= 0 || sources.length > 1 ? [dest.text] : [dest.text, path.posix.dirname(dest.text)];
      for (const d of unique(dirs)) {
        const w = { ...s, text: `${d}/${s.text}`, dynamic: s.dynamic || dest.dynamic };
        effects.push(pathEffect("read", w, ctx, command, "the link points here"));
      }
    }
    if (dest) effects.push(pathEffect("write", dest, ctx, command, name === "ln" ? "creates a link" : "copies into"));
    return;
  }
  if (name === "touch" || name === "mkdir" || name === "mkfifo" || name === "mknod" || name === "chmod" || name === "chown" || name === "chgrp" || name === "setfacl" || name === "chattr" || name === "tee" || name === "sponge" || name === "patch" || name === "split" || name === "csplit") {
    let pos = positionals(words, optsFor(name));
    if (name === "chmod" || name === "chown" || name === "chgrp" || name === "setfacl" || name === "chattr") pos = pos.slice(1);
    if (name === "patch") {
      effects.push(effect("write", { raw: ".", cwd: ctx.cwd, command, reason: "patches files (targets named inside the patch)" }));
      for (const t of pos) effects.push(pathEffect("write", t, ctx, command, "patches"));
      return;
    }
    for (const t of pos) effects.push(pathEffect("write", t, ctx, command, name === "tee" ? "writes (tee)" : `modifies (${name})`));
    if ((name === "split" || name === "csplit") && pos.length === 0) effects.push(pathEffect("write", { text: ".", dynamic: false }, ctx, command, "writes pieces"));
    if (name === "csplit") {
      // csplit writes PREFIX00, PREFIX01...: the prefix names where (default: xx here)
      for (let k = 1; k < words.length; k++) {
        const t = words[k].text;
        const m = /^(?:-f|--prefix=)(.+)$/.exec(t);
        const prefix = m ? { ...words[k], text: m[1] } : t === "-f" || t === "--prefix" ? words[k + 1] : null;
        if (prefix) effects.push(pathEffect("write", prefix, ctx, command, "csplit writes its pieces here"));
        // a suffix format with a slash puts the pieces in another folder
        if (/^(?:-b|--suffix-format)/.test(t) && /\//.test(t + (t === "-b" || t === "--suffix-format" ? (words[k + 1]?.text ?? "") : ""))) effects.push(effect("exec", { command, reason: "csplit with a suffix format naming a folder" }));
      }
    }
    return;
  }
  if (name === "dd") {
    for (const w of words.slice(1)) {
      if (w.text.startsWith("of=")) effects.push(pathEffect("write", { ...w, text: w.text.slice(3) }, ctx, command, "writes (dd)"));
      if (w.text.startsWith("if=")) effects.push(pathEffect("read", { ...w, text: w.text.slice(3) }, ctx, command, "reads (dd)"));
    }
    return;
  }
  if (name === "tar" || name === "unzip" || name === "gunzip" || name === "gzip" || name === "bzip2" || name === "xz" || name === "zip" || name === "7z") {
    // archive tools write next to their inputs or into cwd; gzip/xz remove the input
    const pos = positionals(words, new Set(["-f", "-C", "-d", "--directory", "--file", "-x", "-T", "-X"]));
    const cIdx = words.findIndex((w) => w.text === "-C" || w.text === "--directory" || (name === "unzip" && w.text === "-d"));
    effects.push(effect("write", { raw: cIdx >= 0 && words[cIdx + 1] ? wordValue(words[cIdx + 1], ctx) : ".", cwd: ctx.cwd, command, reason: `unpacks or packs files (${name})`, unknownTarget: cIdx >= 0 && words[cIdx + 1] && wordValue(words[cIdx + 1], ctx) === null }));
    for (const t of pos) effects.push(pathEffect(["gzip", "bzip2", "xz", "gunzip"].includes(name) && !hasFlag(words, "-k", "--keep", "-c", "--stdout") ? "delete" : "write", t, ctx, command, `${name} replaces or writes this file`));
    const f = words.findIndex((w) => w.text === "-f" || w.text === "--file" || /^-[a-zA-Z]*f$/.test(w.text));
    if (name === "tar" && f >= 0 && words[f + 1]) effects.push(pathEffect("write", words[f + 1], ctx, command, "tar archive"));
    return;
  }
  // git
  if (name === "git") {
    classifyGit(words, ctx, effects, command);
    return;
  }

  // network tools
  if (Object.hasOwn(NETWORK_TOOLS, name)) {
    for (const e of netEffects(words, command, `${name} reaches the network`)) effects.push(e);
    if (name === "curl" || name === "wget") {
      const outFlags = name === "curl" ? ["-o", "--output"] : ["-O", "--output-document"];
      const oIdx = words.findIndex((w) => outFlags.includes(w.text));
      if (oIdx >= 0 && words[oIdx + 1]) effects.push(pathEffect("write", words[oIdx + 1], ctx, command, "saves a download"));
      else if ((name === "curl" && hasFlag(words, "-O", "--remote-name")) || name === "wget") effects.push(effect("write", { raw: ".", cwd: ctx.cwd, command, reason: "saves a download" }));
    }
    return;
  }
  const pmName = name === "python" || name === "python3" ? pythonModule(words) : name;
  if (pmName && Object.hasOwn(PACKAGE_MANAGERS, pmName)) {
    const pm = PACKAGE_MANAGERS[pmName];
    const argv = pmName === name ? words : words.slice(words.findIndex((w) => w.text === "-m") + 1);
    const sub = positionals(argv, new Set(["-C", "--prefix", "--cwd", "-w", "--workspace", "--manifest-path", "-p", "--package", "-r", "--requirement"]))[0];
    const subText = sub ? sub.text : "";
    const netted = pm.subs.includes("*") || pm.subs.includes(subText) || (pmName === "pacman" && words.some((w) => /^-S/.test(w.text)));
    if (netted) {
      const idx = words.findIndex((w) => ["--index-url", "-i", "--registry", "--extra-index-url", "--source"].includes(w.text));
      const custom = idx >= 0 && words[idx + 1] ? urlDomains([words[idx + 1]]) : [];
      const domain = custom[0] ?? pm.domain;
      effects.push(effect("network", { domain, command, reason: `${pmName} ${subText} downloads packages` }));
      if (pmName === "npx" || pmName === "uvx" || pmName === "bunx" || pmName === "pnpx" || subText === "run" || subText === "exec" || subText === "x" || subText === "dlx" || subText === "create")
        effects.push(effect("exec", { command, reason: "runs a downloaded or project-defined program" }));
      else effects.push(effect("write", { raw: ".", cwd: ctx.cwd, command, reason: "installs packages" }));
      return;
    }
    effects.push(effect("exec", { command, reason: `${pmName} ${subText || ""}`.trim() + " runs project code or tools" }));
    return;
  }

  if (INTERPRETERS.has(name) || /^python3\.\d+$/.test(name)) {
    effects.push(effect("exec", { command, reason: `${name} runs a program whose effects are not inspected` }));
    return;
  }

  if (name === "trap") {
    // trap 'CMD' SIGNAL...: CMD runs later, in this shell
    const pos = words.slice(1).filter((w) => !["-p", "-l", "--", "-", ""].includes(w.text));
    if (pos.length >= 2 || (pos.length === 1 && !/^-?[0-9A-Z]+$/.test(pos[0].text))) recurseString(pos[0], ctx, effects, command);
    return;
  }
  if (DECLARE.has(name) || name === "read" || name === "mapfile" || name === "readarray" || name === "let" || name === "alias") {
    classifyAssigningBuiltin(name, words, ctx, effects, command);
    return;
  }
  if (name === "awk" || name === "gawk" || name === "mawk" || name === "busybox-awk") {
    classifyAwk(name, words, ctx, effects, command);
    return;
  }
  if (name === "sed") {
    classifySed(words, ctx, effects, command);
    return;
  }

  if (READ_ONLY.has(name)) {
    const spec = SPECS[name];
    const why = readOnlyBuiltinRisk(name, words, ctx);
    if (why) {
      effects.push(effect("exec", { command, reason: why }));
      return;
    }
    // `echo $x` is harmless whatever $x holds; a command with options is not
    const split = spec.anyArgs ? undefined : firstSplit(words, ctx);
    if (split) {
      effects.push(effect("exec", { command, reason: splitReason(name, split) }));
      return;
    }
    const checked = checkArgs(name, words, (w) => mayBeOption(w, ctx));
    if (!checked.ok) {
      effects.push(effect("exec", { command, reason: checked.reason }));
      return;
    }
    if (["let", "test", "[", "[[", "printf", "hash"].includes(name) && words.some((w) => w.quoted && /\$\(|`/.test(w.text))) {
      effects.push(effect("exec", { command, reason: `${name} may evaluate a command substitution in an arithmetic or name context` }));
      return;
    }
    for (const f of checked.files) effects.push(pathEffect(f.op, f.word, ctx, command, f.reason));
    let pos = checked.positionals;
    if (spec.pos === "none") return;
    if (spec.pos === "nopos") {
      if (pos.length) effects.push(effect("exec", { command, reason: `${name} with an argument changes the system` }));
      return;
    }
    if (spec.pos === "date") {
      if (pos.some((w) => !w.text.startsWith("+"))) effects.push(effect("exec", { command, reason: "date with a time argument sets the clock" }));
      return;
    }
    if (spec.pos === "xxd" || spec.pos === "uniq") {
      // a glob may match two files, and the second is the output (`uniq *.txt`)
      if (pos.some((w) => w.glob)) {
        effects.push(effect("exec", { command, reason: `${name} with a glob: a second match would be its output file` }));
        return;
      }
      if (pos[0]) effects.push(pathEffect("read", pos[0], ctx, command, "reads"));
      if (pos[1]) effects.push(pathEffect("write", pos[1], ctx, command, `${name} writes its output file`));
      if (pos.length > 2) effects.push(effect("exec", { command, reason: `${name} with extra arguments` }));
      return;
    }
    if (spec.pos === "pattern") {
      const opts = words.slice(1).map((w) => w.text);
      const patternGiven = opts.some((t) => /^(-[a-zA-Z]*[ef]|--regexp|--file|--from-file)/.test(t));
      if (!patternGiven) pos = pos.slice(1);
      if (name === "jq" && opts.some((t) => t === "--args" || t === "--jsonargs")) pos = [];
    }
    const recursiveGrep = ["grep", "egrep", "fgrep", "zgrep"].includes(name) && hasFlag(words, "-r", "-R", "--recursive", "--dereference-recursive");
    if (pos.length === 0 && (spec.dflt || recursiveGrep)) pos = [{ text: spec.dflt ?? ".", dynamic: false }];
    for (const t of pos) effects.push(pathEffect("read", t, ctx, command, "reads"));
    return;
  }

  // anything else: a command we do not know
  effects.push(effect("exec", { command, reason: `runs ${name} (side effects unknown)` }));
}

/**
 * Does the shell turn this word into a number of words we cannot know? An
 * unquoted expansion is split and globbed (`$x` may hold `1 -o FILE`), a
 * brace expansion (bash) is several words. Such a word can become extra
 * options or arguments wherever it stands, so a command that is a read for
 * known words is not a read with it. (Plain globs are judged where they
 * stand: as a file argument by `mayBeOption`, elsewhere by `isGlob`.)
 */
function splits(w, ctx) {
  if (w.split || w.brace) return true;
  // unquoted $HOME/$PWD: known values, split only if they hold blanks or glob characters
  if (w.splitKnown) return /[\s*?[\]{}]/.test(`${ctx.home}${ctx.cwd ?? " "}`);
  return false;
}

/** The first word after the command name that `splits`, or undefined. */
function firstSplit(words, ctx) {
  return words.slice(1).find((w) => splits(w, ctx));
}

function splitReason(name, w) {
  return `${name}: the unquoted expansion ${segmentText([w])} may become several words (options included)`;
}

// `set` flags and `-o` names that only change how the shell reports or stops.
// Not -k/keyword: it makes `NAME=value` words after a command name its
// environment (`set -k; git status GIT_CONFIG_COUNT=1 …`).
const SET_FLAGS = /^[-+][abefhmnuvxBCEHPT]+$/;
const SET_OPTIONS = new Set(["errexit", "nounset", "pipefail", "xtrace", "verbose", "noclobber", "noglob", "noexec", "errtrace", "functrace", "allexport", "physical", "notify", "hashall", "monitor", "braceexpand", "histexpand", "ignoreeof"]);
const TEST_UNARY = new Set(["-a", "-b", "-c", "-d", "-e", "-f", "-g", "-h", "-k", "-p", "-r", "-s", "-t", "-u", "-w", "-x", "-G", "-L", "-N", "-O", "-S", "-z", "-n", "-o"]);
const TEST_BINARY = new Set(["=", "==", "!=", "<", ">", "-eq", "-ne", "-lt", "-le", "-gt", "-ge", "-nt", "-ot", "-ef", "=~", "-a", "-o"]);
const TEST_ARITH = new Set(["-eq", "-ne", "-lt", "-le", "-gt", "-ge"]);
const PLAIN_NAME = /^[A-Za-z_][A-Za-z0-9_]*(?:\[[0-9]+\])?$/;

/**
 * Builtins on the read-only list whose arguments can still run code in bash:
 * `set -k`, `test -v 'a[$(cmd)]'`, `[[ $x -eq 0 ]]` (both operands are
 * evaluated as arithmetic, so x='a[$(cmd)]' runs cmd), `unset 'a[$(cmd)]'`.
 * Returns why, or null.
 */
function readOnlyBuiltinRisk(name, words, ctx) {
  const args = words.slice(1);
  const literal = (w) => w !== undefined && !w.dynamic && !splits(w, ctx) && !w.glob;
  if (name === "set") {
    for (let i = 0; i < args.length; i++) {
      const t = args[i].text;
      if (!literal(args[i])) return "set with a computed word (it could be -k, which turns later words into a command's environment)";
      if (t === "--" || t === "-") break;
      if (/^[-+][abefhmnuvxBCEHPT]*o$/.test(t)) {
        // -o NAME, also clustered: -euo pipefail
        if (!SET_FLAGS.test(t.slice(0, -1)) && t.length > 2) return `set ${t}: option not known to be harmless`;
        if (i + 1 >= args.length) break;
        if (!literal(args[i + 1]) || !SET_OPTIONS.has(args[i + 1].text)) return `set ${t} ${args[i + 1].text}: option not known to be harmless`;
        i++;
        continue;
      }
      if (/^[-+]/.test(t)) {
        if (!SET_FLAGS.test(t)) return `set ${t}: option not known to be harmless (-k turns words after a command name into its environment)`;
        continue;
      }
      break; // the positional parameters
    }
    return null;
  }
  if (name === "unset") {
    for (const w of args) {
      if (!literal(w) || !(/^-[fvn]$/.test(w.text) || /^[A-Za-z_][A-Za-z0-9_]*(?:\[(?:[0-9]+|@|\*)\])?$/.test(w.text))) return "unset of a computed name or subscript (bash evaluates subscripts as arithmetic)";
      // `unset PATH; ls`: bash then searches the current directory
      const bad = /^-/.test(w.text) ? null : unsafeAssignment(`${w.text.replace(/\[.*$/, "")}=`);
      if (bad) return bad.replace(/^sets /, "unsets ");
    }
    return null;
  }
  if (name === "test" || name === "[" || name === "[[") {
    const ops = args.filter((w, k) => !(k === args.length - 1 && (w.text === "]" || w.text === "]]")));
    for (let k = 0; k < ops.length; k++) {
      const w = ops[k];
      const t = w.text;
      if (literal(w) && (t === "-v" || t === "-R")) {
        const v = ops[k + 1];
        if (!literal(v) || !PLAIN_NAME.test(v.text)) return `${name} ${t} with a computed name or subscript (bash evaluates subscripts as arithmetic)`;
      }
      if (name === "[[" && literal(w) && TEST_ARITH.has(t)) {
        for (const v of [ops[k - 1], ops[k + 1]]) {
          if (!literal(v) || !/^[-+]?[0-9]+$/.test(v.text)) return `[[ ${t} ]] evaluates both sides as arithmetic (a variable's value can run commands in bash)`;
        }
      }
      if (name !== "[[" && (w.dynamic || splits(w, ctx) || w.glob)) {
        // test's own parser decides what is an operator: a computed word is
        // only data right after a literal operator or right before a binary one
        const prev = ops[k - 1];
        const next = ops[k + 1];
        const afterOp = literal(prev) && (TEST_UNARY.has(prev.text) || TEST_BINARY.has(prev.text));
        const beforeBin = literal(next) && TEST_BINARY.has(next.text);
        if (splits(w, ctx) || w.glob || !(afterOp || beforeBin)) return `${name}: a computed word could be an operator (-v runs subscripts in bash)`;
      }
    }
    return null;
  }
  return null;
}

/** Why assigning `NAME=...` is not harmless, or null when it is. */
function unsafeAssignment(text) {
  const m = /^([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])?\+?=?/.exec(text);
  if (!m) return `assigns ${text} (not a plain name)`;
  // an array subscript is arithmetic: a name in it is evaluated, and its value may run commands
  if (m[2] && !/^\[(?:[0-9]+|@|\*)\]$/.test(m[2])) return `the subscript of ${m[1]} is evaluated as arithmetic (it can run commands)`;
  if (!SAFE_VAR.test(m[1])) return `sets ${m[1]}, which programs read (it can change what later commands run)`;
  return null;
}

/** Could this word reach the program as an option (`-...`)? Expansions and globs can. */
function mayBeOption(w, ctx) {
  if (w.text.startsWith("-")) return true;
  if (w.dynamic && w.text.startsWith("\u0000")) return true;
  if (w.glob && /^[*?[{]/.test(w.text)) {
    // a glob expands to the names in the directory: one of them may start with -
    if (ctx.cwd == null) return true;
    let names;
    try {
      names = fs.readdirSync(ctx.cwd);
    } catch {
      return true;
    }
    const slash = w.text.indexOf("/");
    const first = slash < 0 ? w.text : w.text.slice(0, slash);
    const re = globRegex(first);
    return names.some((n) => n.startsWith("-") && re.test(n)) || first.startsWith("{");
  }
  return false;
}

function classifyAssigningBuiltin(name, words, ctx, effects, command) {
  const args = words.slice(1);
  if (name === "let") {
    // arithmetic on variables: bash evaluates their values as expressions
    // (`x='a[$(cmd)]'; let y=x` runs cmd)
    effects.push(effect("exec", { command, reason: "let evaluates arithmetic on variables (their values can run commands in bash)" }));
    return;
  }
  // `export y=$x` with x='a PATH=.': some shells split these words
  const split = firstSplit(words, ctx);
  if (split) {
    effects.push(effect("exec", { command, reason: splitReason(name, split) }));
    return;
  }
  if (DECLARE.has(name) && args.some((w) => /^[-+][A-Za-z]*i/.test(w.text))) {
    // an integer variable evaluates every value assigned to it as arithmetic
    effects.push(effect("exec", { command, reason: `${name} -i evaluates assigned values as arithmetic (bash runs command substitutions in them)` }));
    return;
  }
  const flagOk = own({
    export: /^-[fnp]+$/,
    declare: /^[-+][aAfFgiIlprtux]+$/,
    typeset: /^[-+][aAfFgiIlprtux]+$/,
    local: /^[-+][aAilrtux]+$/,
    readonly: /^-[aAfp]+$/,
    read: /^-[ers]+$/,
    mapfile: /^-[t]+$/,
    readarray: /^-[t]+$/,
    let: /^$/,
    alias: /^-p$/,
  }, name);
  const withArg = new Set(name === "read" ? ["-a", "-d", "-i", "-n", "-N", "-p", "-t", "-u"] : name === "mapfile" || name === "readarray" ? ["-d", "-n", "-O", "-s", "-u"] : []);
  if (name === "alias" && args.some((w) => w.text !== "-p")) {
    effects.push(effect("exec", { command, reason: "alias defines a command" }));
    return;
  }
  for (let i = 0; i < args.length; i++) {
    const w = args[i];
    const t = w.text;
    if (/\$\(|`/.test(t) && (w.quoted || name === "let")) {
      effects.push(effect("exec", { command, reason: `${name} may evaluate a command substitution` }));
      return;
    }
    if (name === "let") {
      // arithmetic: assignments inside expressions; names in it are variables
      const m = t.match(/[A-Za-z_][A-Za-z0-9_]*\s*(\[[^\]]*\])?\s*([-+*/%&|^]|<<|>>)?=(?!=)/g) ?? [];
      for (const a of m) {
        const bad = unsafeAssignment(a.replace(/\s+/g, "").replace(/([-+*/%&|^]|<<|>>)=$/, "="));
        if (bad) {
          effects.push(effect("exec", { command, reason: bad }));
          return;
        }
      }
      continue;
    }
    if (withArg.has(t)) {
      if (t === "-a") {
        const bad = args[i + 1] ? unsafeAssignment(args[i + 1].text) : null;
        if (bad) effects.push(effect("exec", { command, reason: bad }));
      }
      i++;
      continue;
    }
    if (/^[-+]/.test(t) && t.length > 1) {
      if (t === "--") continue;
      if (!flagOk.test(t)) {
        effects.push(effect("exec", { command, reason: `${name} ${t}: option not known to be harmless` }));
        return;
      }
      continue;
    }
    if (w.dynamic && t.startsWith("\u0000")) {
      effects.push(effect("exec", { command, reason: `${name} with a computed name` }));
      return;
    }
    const bad = unsafeAssignment(t);
    if (bad) {
      effects.push(effect("exec", { command, reason: bad }));
      return;
    }
  }
}

function classifyAwk(name, words, ctx, effects, command) {
  // awk [-F fs] [-v var=val]... 'program' [file | var=val]...
  const split = firstSplit(words, ctx);
  if (split) {
    effects.push(effect("exec", { command, reason: splitReason(name, split) }));
    return;
  }
  let program = null;
  const files = [];
  for (let i = 1; i < words.length; i++) {
    const w = words[i];
    const t = w.text;
    if (program === null && (t === "-F" || t === "-v" || t === "--field-separator" || t === "--assign")) {
      if (!words[i + 1] || words[i + 1].glob) {
        effects.push(effect("exec", { command, reason: `${name} ${t} without a plain argument` }));
        return;
      }
      if (t === "-v" || t === "--assign") {
        const bad = /^[A-Za-z_][A-Za-z0-9_]*=/.test(words[i + 1].text) ? null : "awk -v without a plain assignment";
        if (bad) {
          effects.push(effect("exec", { command, reason: bad }));
          return;
        }
      }
      i++;
      continue;
    }
    if (program === null && /^(-F.|-v[A-Za-z_]|--field-separator=|--assign=)/.test(t)) continue;
    if (program === null && t === "--") continue;
    if (program === null && (t.startsWith("-") || mayBeOption(w, ctx))) {
      effects.push(effect("exec", { command, reason: `${name} ${t}: option not known to be harmless (program files, extensions)` }));
      return;
    }
    if (program === null) {
      if (w.dynamic || !awkProgramSafe(t)) {
        effects.push(effect("exec", { command, reason: "awk program may write files or run commands" }));
        return;
      }
      program = t;
      continue;
    }
    if (/^[A-Za-z_][A-Za-z0-9_]*=/.test(t)) continue; // var=value operand
    files.push(w);
  }
  if (program === null) {
    effects.push(effect("exec", { command, reason: "awk without a program text" }));
    return;
  }
  for (const f of files) effects.push(pathEffect("read", f, ctx, command, "reads"));
}

function classifySed(words, ctx, effects, command) {
  // sed [options] [script] [file...]; -e/--expression give scripts, -f a script file
  const split = firstSplit(words, ctx);
  if (split) {
    effects.push(effect("exec", { command, reason: splitReason("sed", split) }));
    return;
  }
  if (words.slice(1).some((w) => w.glob && w.text.startsWith("-"))) {
    effects.push(effect("exec", { command, reason: "sed: a glob could expand to options" }));
    return;
  }
  const scripts = [];
  const files = [];
  let inPlace = false;
  let endOpts = false;
  for (let i = 1; i < words.length; i++) {
    const w = words[i];
    const t = w.text;
    if (!endOpts && t === "--") {
      endOpts = true;
      continue;
    }
    if (!endOpts && t.startsWith("--")) {
      const [n, v] = t.includes("=") ? [t.slice(0, t.indexOf("=")), t.slice(t.indexOf("=") + 1)] : [t, undefined];
      if (n === "--expression") {
        const val = v !== undefined ? { ...w, text: v } : words[++i];
        if (!val) break;
        scripts.push(val);
      } else if (n === "--in-place") inPlace = true;
      else if (!["--quiet", "--silent", "--regexp-extended", "--separate", "--unbuffered", "--null-data", "--posix", "--debug", "--sandbox", "--follow-symlinks", "--line-length", "--help", "--version"].includes(n)) {
        effects.push(effect("exec", { command, reason: `sed ${n}: option not known to be harmless` }));
        return;
      } else if (n === "--line-length" && v === undefined) i++;
      continue;
    }
    if (!endOpts && t.startsWith("-") && t.length > 1) {
      for (let j = 1; j < t.length; j++) {
        const c = t[j];
        if ("nErsuzb".includes(c)) continue;
        if (c === "i") {
          inPlace = true; // -i[SUFFIX]: the rest is the suffix
          break;
        }
        if (c === "e" || c === "l") {
          const rest = t.slice(j + 1);
          const val = rest.length ? { ...w, text: rest } : words[++i];
          if (c === "e" && val) scripts.push(val);
          break;
        }
        effects.push(effect("exec", { command, reason: `sed -${c}: option not known to be harmless (e.g. -f runs a script file)` }));
        return;
      }
      continue;
    }
    if (!endOpts && mayBeOption(w, ctx)) {
      effects.push(effect("exec", { command, reason: "sed: an argument could expand to an option" }));
      return;
    }
    if (scripts.length === 0 && !words.slice(1, i).some((x) => /^(-[a-zA-Z]*e|--expression)/.test(x.text))) scripts.push(w);
    else files.push(w);
  }
  if (scripts.length === 0 || scripts.some((w) => w.dynamic || !sedScriptSafe(w.text))) {
    effects.push(effect("exec", { command, reason: "sed script may run commands or write/read other files (e, w, r, s///e)" }));
    return;
  }
  for (const f of files) effects.push(pathEffect(inPlace ? "write" : "read", f, ctx, command, inPlace ? "edits in place (sed -i)" : "reads"));
}

function pythonModule(words) {
  const i = words.findIndex((w) => w.text === "-m");
  if (i < 0 || !words[i + 1]) return null;
  const m = words[i + 1].text;
  if (m === "pip" || m === "pip3") return "pip";
  if (m === "uv") return "uv";
  if (m === "poetry") return "poetry";
  if (m === "http.server") return null;
  return null;
}

/**
 * The wrapped command's words, or null when the wrapper has an option we do
 * not know, or one of its own words (option, option argument, `timeout`'s
 * duration, `env`'s assignments) may split into several words: `timeout $x
 * ls` with x='1 rm -rf F' runs rm.
 */
function unwrap(words, spec, ctx) {
  const short = new Map((spec.opts ?? []).map((o) => [o[1], o.endsWith("=")]));
  const long = new Map((spec.longOpts ?? []).map((o) => [o.replace(/=$/, "").slice(2), o.endsWith("=")]));
  const known = (w) => w !== undefined && !splits(w, ctx) && !w.glob;
  let i = 1;
  let positional = spec.positional ?? 0;
  while (i < words.length) {
    const w = words[i];
    const t = w.text;
    // a computed word here is either the wrapper's (unknown effect) or the
    // command's name (judged as a computed command): both ask
    if (!known(w)) return i > 1 || positional > 0 || spec.assignments ? null : words.slice(i);
    if (t === "--") {
      i++;
      break;
    }
    if (spec.assignments && /^[A-Za-z_][A-Za-z0-9_]*=/.test(t)) {
      i++;
      continue;
    }
    if (t.startsWith("--")) {
      const eq = t.indexOf("=");
      const name = eq < 0 ? t.slice(2) : t.slice(2, eq);
      if (!long.has(name)) return null;
      if (long.get(name) && eq < 0) {
        if (!known(words[i + 1])) return null;
        i += 2;
      } else i++;
      continue;
    }
    if (t.startsWith("-") && t.length > 1) {
      let j = 1;
      let skipNext = false;
      for (; j < t.length; j++) {
        if (!short.has(t[j])) return null;
        if (short.get(t[j])) {
          skipNext = j === t.length - 1;
          break;
        }
      }
      if (skipNext && !known(words[i + 1])) return null;
      i += skipNext ? 2 : 1;
      continue;
    }
    if (positional > 0) {
      positional--;
      i++;
      continue;
    }
    break;
  }
  return words.slice(i);
}

/**
 * A cd may not happen: its folder may not exist (yet), or it runs only if
 * the command before it succeeded (`a && cd x`) or failed (`a || cd x`).
 * Commands chained to it with `&&` run only if it did; any other command
 * after it may run in either folder (`cd elsewhere; cd missing; echo x > f`
 * writes in elsewhere), so the directory becomes unknown for them.
 */
function noteUncertainCd(cmd, ctx, before) {
  if (ctx.cwd === before) return;
  const sep = cmd.sep ?? ";";
  let exists = false;
  try {
    exists = ctx.cwd !== null && fs.statSync(ctx.cwd).isDirectory();
  } catch {
    exists = false;
  }
  if (exists && (sep === ";" || sep === "\n")) return;
  const earlier = ctx.pendingCd;
  ctx.pendingCd = { before: earlier ? earlier.before : before, viaOr: sep === "||" || (earlier?.viaOr ?? false) };
}

/** Before classifying `cmd`: settle a pending uncertain cd (see noteUncertainCd). */
function settleUncertainCd(cmd, ctx) {
  const p = ctx.pendingCd;
  if (!p) return;
  const sep = cmd.sep ?? ";";
  if ((sep === "&&" || sep === "|" || sep === "|&") && !p.viaOr) return;
  if (p.before !== ctx.cwd) ctx.cwd = null;
  ctx.pendingCd = null;
}

/**
 * Classify a command another program runs (a wrapper's, xargs', find -exec's):
 * a `cd` there moves that child, not this shell, so the working directory
 * this classifier tracks becomes unknown rather than wrong.
 */
function classifyChild(cmd, ctx, effects) {
  const before = ctx.cwd;
  classifySimple(cmd, ctx, effects);
  if (ctx.cwd !== before) ctx.cwd = null;
}

function recurseString(w, ctx, effects, command, { sameShell = false } = {}) {
  if (w.dynamic) {
    effects.push(effect("exec", { command, reason: "runs a computed command string" }));
    return;
  }
  if (ctx.depth > 8) {
    effects.push(effect("exec", { command, reason: "nesting too deep to inspect" }));
    return;
  }
  const innerCtx = { ...ctx, depth: ctx.depth + 1 };
  const inner = classifyCommandEffects(w.text, innerCtx);
  for (const e of inner) effects.push(e);
  // eval runs in this shell: a cd inside it moves this shell too
  if (sameShell) ctx.cwd = innerCtx.cwd;
}

function classifyFind(words, ctx, effects, command) {
  // find [paths...] [expression]; paths are the args before the first
  // expression token (starting with -, ( or !)
  const split = firstSplit(words, ctx);
  if (split) {
    effects.push(effect("exec", { command, reason: splitReason("find", split) }));
    return;
  }
  const roots = [];
  let i = 1;
  while (i < words.length && ["-H", "-L", "-P"].includes(words[i].text)) i++;
  for (; i < words.length; i++) {
    const t = words[i].text;
    if (t.startsWith("-") || t === "(" || t === "!" || t === ")") break;
    if (mayBeOption(words[i], ctx)) {
      effects.push(effect("exec", { command, reason: "find: a starting point could expand to an expression (a file named -delete)" }));
      return;
    }
    roots.push(words[i]);
  }
  // a glob in the expression becomes as many words as it matches
  if (words.slice(i).some((w) => w.glob)) {
    effects.push(effect("exec", { command, reason: "find: an unquoted glob in the expression may become several words (-exec …)" }));
    return;
  }
  if (roots.length === 0) roots.push({ text: ".", dynamic: false });
  const expr = words.slice(i);
  let mutated = false;
  for (let j = 0; j < expr.length; j++) {
    const t = expr[j].text;
    if (t === "-delete") {
      for (const r of roots) effects.push({ ...pathEffect("delete", r, ctx, command, "find -delete removes matching files"), contents: true });
      mutated = true;
    } else if (["-exec", "-execdir", "-ok", "-okdir"].includes(t)) {
      const end = expr.findIndex((w, k) => k > j && (w.text === ";" || w.text === "+" || w.text === "\\;"));
      const innerWords = expr.slice(j + 1, end < 0 ? expr.length : end).map((w) => (w.text === "{}" ? { ...w, text: "{}", dynamic: true } : w));
      const sub = [];
      if (innerWords.length) classifyChild({ words: innerWords, redirects: [] }, ctx, sub);
      for (const e of sub) {
        if (e.unknownTarget && (e.op === "delete" || e.op === "move" || e.op === "write")) {
          // `{}` is each found file: the roots are the real scope
          for (const r of roots) effects.push({ ...pathEffect(e.op, r, ctx, command, `find ${t} ${e.reason}`), contents: true });
        } else effects.push(e);
      }
      mutated = true;
      if (end > 0) j = end;
    } else if (["-fprint", "-fprint0", "-fprintf", "-fls"].includes(t) && expr[j + 1]) {
      effects.push(pathEffect("write", expr[j + 1], ctx, command, `find ${t} writes a file`));
      mutated = true;
      j += t === "-fprintf" ? 2 : 1;
    } else if (/^-newer[amcBt][amcBt]$/.test(t)) {
      j += 1;
    } else if (FIND_PRIMARIES.has(t)) {
      j += FIND_PRIMARIES.get(t);
    } else {
      effects.push(effect("exec", { command, reason: `find ${t}: not known to be read-only` }));
      mutated = true;
    }
  }
  void mutated;
  for (const r of roots) effects.push(pathEffect("read", r, ctx, command, "reads (find)"));
}

// Commands labelled `write` (auto-allowed in scope) that have no option that
// runs a program (GNU and busybox). Deletes and moves always ask.
const FILE_CHANGERS = new Set(["cp", "ln", "touch", "mkdir", "mkfifo", "mknod", "chmod", "chown", "chgrp", "chattr", "tee", "sponge", "csplit", "dd"]);

/**
 * The directory `-t DIR`, `-tDIR`, `--target-directory DIR` or
 * `--target-directory=DIR` names (cp, ln, mv, install), as a word, or null.
 */
function targetDirectory(words) {
  for (let k = 1; k < words.length; k++) {
    const t = words[k].text;
    if (t === "--") break;
    if (t === "--target-directory" || /^-[A-Za-z]*t$/.test(t)) return words[k + 1] ?? null;
    const m = /^(?:--target-directory=|-[A-Za-z]*t)(.+)$/.exec(t);
    if (m && !t.startsWith("--") === /^-[A-Za-z]*t/.test(t)) return { ...words[k], text: m[1] };
  }
  return null;
}

/** `{ reason }` when a write command may do more than write files, else `{ reason: null, files }` (the write targets its options name). */
function writeRisk(name, words, ctx) {
  if (name === "patch") return { reason: "patch writes the files its input names and may run ed for ed-style patches" };
  if (name === "7z") return { reason: "7z: options not inspected" };
  const split = firstSplit(words, ctx);
  if (split) return { reason: splitReason(name, split) };
  const checked = checkWriteArgs(name, words, (w) => mayBeOption(w, ctx));
  if (!checked.ok) return { reason: checked.reason };
  if (name === "tar" && !words.some((w) => w.text === "--force-local") && words.slice(1).some((w) => !w.text.startsWith("-") && /^[^/]*:/.test(w.text))) return { reason: "tar reaches host:file archives through a remote shell" };
  return { reason: null, files: checked.files };
}

function classifyGit(words, ctx, effects, command) {
  const split = firstSplit(words, ctx);
  if (split) {
    effects.push(effect("exec", { command, reason: splitReason("git", split) }));
    return;
  }
  let i = 1;
  let gitCwd = ctx.cwd;
  while (i < words.length && words[i].text.startsWith("-")) {
    const t = words[i].text;
    if (t === "-C" && words[i + 1]) {
      const v = wordValue(words[i + 1], ctx);
      gitCwd = v === null ? null : resolvePath(v, ctx.cwd ?? "/", { home: ctx.home });
    } else if (t === "-c" || t.startsWith("--config-env") || t === "--exec-path" || t.startsWith("--exec-path=") || t === "--git-dir" || t.startsWith("--git-dir=") || t === "--work-tree" || t.startsWith("--work-tree=") || t === "--namespace" || t.startsWith("--namespace=")) {
      // configuration and repository overrides can name programs to run or another repository
      effects.push(effect("exec", { command, reason: `git ${t} changes configuration or the repository (not inspected)` }));
    } else if (!GIT_GLOBAL_FLAGS.has(t)) {
      effects.push(effect("exec", { command, reason: `git ${t}: global option not known to be harmless` }));
    }
    i += GIT_GLOBAL_OPTS_WITH_ARG.has(t) ? 2 : 1;
  }
  const sub = words[i] ? words[i].text : "";
  const rest = words.slice(i);
  const here = { ...ctx, cwd: gitCwd };
  const repoWrite = (reason) => effects.push(effect("write", { raw: ".", cwd: gitCwd, command, reason, unknownTarget: gitCwd === null }));
  if (sub === "reflog" && ["expire", "delete", "drop"].includes(rest[1]?.text ?? "")) {
    effects.push(effect("delete", { raw: ".", cwd: gitCwd, command, reason: "git reflog expire/delete drops history", unknownTarget: gitCwd === null, contents: true }));
    return;
  }
  if (sub === "" || GIT_READ.has(sub)) {
    if (sub !== "") {
      const checked = checkGitArgs(sub, sub === "reflog" && rest[1]?.text === "show" ? rest.slice(1) : rest, (w) => mayBeOption(w, ctx));
      if (!checked.ok) {
        effects.push(effect("exec", { command, reason: checked.reason }));
        return;
      }
      for (const f of checked.files) effects.push(pathEffect(f.op, f.word, here, command, f.reason));
    }
    effects.push(effect("read", { raw: ".", cwd: gitCwd, command, reason: "reads the repository", unknownTarget: gitCwd === null }));
    return;
  }
  if (GIT_NETWORK.has(sub)) {
    if (sub === "remote" && !["update", "prune", "show"].includes(rest[1]?.text ?? "")) {
      repoWrite("changes remote configuration");
      return;
    }
    if (sub === "submodule" && !["update", "add", "sync", "foreach"].includes(rest[1]?.text ?? "")) {
      effects.push(effect("read", { raw: ".", cwd: gitCwd, command, reason: "reads submodules" }));
      return;
    }
    if (sub === "submodule" && rest[1]?.text === "foreach") effects.push(effect("exec", { command, reason: "git submodule foreach runs a command" }));
    const domains = urlDomains(rest.slice(1));
    if (domains.length) for (const d of domains) effects.push(effect("network", { domain: d, command, reason: `git ${sub} reaches the network` }));
    else effects.push(effect("network", { domain: null, command, reason: `git ${sub} reaches a configured remote`, unknownTarget: true }));
    if (sub === "clone") {
      const pos = positionals(rest, new Set(["-b", "--branch", "--depth", "-o", "--origin", "-c", "--config", "--reference", "--separate-git-dir", "-j", "--filter"]));
      const dest = pos[1];
      if (dest) effects.push(pathEffect("write", dest, here, command, "clones into"));
      else repoWrite("clones into the current folder");
    } else if (sub !== "ls-remote" && sub !== "push") repoWrite(`git ${sub} updates the repository`);
    return;
  }
  if (sub === "config") {
    // reading a value is a read; setting any key is not judged (diff.external,
    // include.path, filter.*.clean, core.fsmonitor... run programs)
    const readOnly = rest.slice(1).every((w) => !w.dynamic && /^(?:--get|--get-all|--get-regexp|--list|-l|--null|-z|--show-origin|--show-scope|--name-only|--local|--bool|--int|--type=[a-z-]+|[A-Za-z][A-Za-z0-9.-]*)$/.test(w.text)) && hasFlag(rest, "--get", "--list", "-l", "--get-all", "--get-regexp");
    if (readOnly) effects.push(effect("read", { raw: ".", cwd: gitCwd, command, reason: "reads git configuration", unknownTarget: gitCwd === null }));
    else effects.push(effect("exec", { command, reason: "git config can set options that run programs (not inspected)" }));
    return;
  }
  {
    const checked = checkWriteArgs(`git ${sub}`, rest, (w) => mayBeOption(w, ctx));
    if (!checked.ok) {
      effects.push(effect("exec", { command, reason: `${checked.reason} (git bisect run, rebase --exec, difftool, filter-branch... run programs)` }));
      return;
    }
  }
  if (sub === "clean") {
    if (hasFlag(rest, "-n", "--dry-run")) effects.push(effect("read", { raw: ".", cwd: gitCwd, command, reason: "git clean dry run" }));
    else effects.push(effect("delete", { raw: ".", cwd: gitCwd, command, reason: "git clean deletes untracked files", unknownTarget: gitCwd === null, contents: true }));
    return;
  }
  if (sub === "rm") {
    const pos = positionals(rest);
    for (const t of pos) effects.push(pathEffect("delete", t, here, command, "git rm deletes"));
    return;
  }
  if (sub === "mv") {
    for (const t of positionals(rest)) effects.push(pathEffect("move", t, here, command, "git mv moves"));
    return;
  }
  const discards =
    (sub === "reset" && hasFlag(rest, "--hard", "--merge", "--keep")) ||
    (sub === "checkout" && (rest.some((w) => w.text === "--" || w.text === ".") || hasFlag(rest, "-f", "--force"))) ||
    (sub === "restore" && !hasFlag(rest, "--staged", "-S")) ||
    (sub === "stash" && ["drop", "clear"].includes(rest[1]?.text ?? "")) ||
    (sub === "branch" && hasFlag(rest, "-D", "-d", "--delete")) ||
    (sub === "switch" && hasFlag(rest, "-f", "--force", "--discard-changes")) ||
    (sub === "worktree" && ["remove", "prune"].includes(rest[1]?.text ?? "")) ||
    sub === "filter-branch" ||
    sub === "gc" ||
    (sub === "reflog" && rest[1]?.text === "expire");
  if (discards) {
    effects.push(effect("delete", { raw: ".", cwd: gitCwd, command, reason: `git ${sub} can discard uncommitted work`, unknownTarget: gitCwd === null, contents: true }));
    return;
  }
  // hooks run on commit/merge/rebase...; they live in the repo, and writes to
  // .git/hooks ask on the host
  repoWrite(`git ${sub} changes the repository`);
}

// Compound commands: a branch may not run, and a loop's body may run any
// number of times, each iteration starting where the one before left. A cd in
// either makes the directory unknown: after the branch, and for the whole loop.
const COMPOUND_END = { if: "fi", while: "done", until: "done", for: "done", select: "done", case: "esac" };
const COMPOUND_CLOSERS = new Set(["fi", "done", "esac"]);

/** The compound keywords `cmd` begins with, in order (`done`, `do`, `if`, …). */
function compoundKeywords(cmd) {
  const out = [];
  for (const w of cmd.words) {
    if (w.quoted || w.dynamic) break;
    if (Object.hasOwn(COMPOUND_END, w.text) || COMPOUND_CLOSERS.has(w.text)) out.push(w.text);
    else if (!KEYWORDS.has(w.text)) break;
    if (w.text === "for" || w.text === "select" || w.text === "case") break; // the header's own words follow
  }
  return out;
}

/** Whether `cmd` is a cd, pushd or popd of this shell (after keywords, assignments, builtin/command). */
function changesDirectory(cmd) {
  for (const w of cmd.words) {
    if (w.quoted || w.dynamic) return false;
    if (KEYWORDS.has(w.text) || Object.hasOwn(COMPOUND_END, w.text) || w.text === "builtin" || w.text === "command") continue;
    if (ASSIGNMENT.test(w.text)) continue;
    return w.text === "cd" || w.text === "pushd" || w.text === "popd";
  }
  return false;
}

/** Whether the compound opened by commands[i] changes directory anywhere before its end. */
function compoundMoves(commands, i) {
  let depth = 0;
  for (let j = i; j < commands.length; j++) {
    if (changesDirectory(commands[j])) return true;
    for (const kw of compoundKeywords(commands[j])) {
      depth += COMPOUND_CLOSERS.has(kw) ? -1 : 1;
      if (depth === 0) return false;
    }
  }
  return true; // never closed: the shell refuses it, but assume the worst
}

/**
 * All effects of a shell command string, paths not yet resolved.
 * Exported for tests.
 */
export function classifyCommandEffects(commandText, ctx) {
  const parsed = parseShell(commandText);
  const effects = [];
  for (const reason of parsed.unsure) effects.push(effect("exec", { command: commandText, reason: `could not fully parse the command (${reason})` }));
  for (const reason of parsed.risky) effects.push(effect("exec", { command: commandText, reason }));
  for (const sub of parsed.subs) {
    if (ctx.depth > 8) {
      effects.push(effect("exec", { command: sub, reason: "nesting too deep to inspect" }));
      continue;
    }
    for (const e of classifyCommandEffects(sub, { ...ctx, depth: ctx.depth + 1 })) effects.push(e);
  }
  if (parsed.compoundChild) ctx.compoundChild = true;
  // A subshell's cd moves only that subshell: the directory is restored when
  // the classifier leaves it (`(cd src && ls); cat a.txt` reads ./a.txt). So
  // is a cd this shell may not have made (noteUncertainCd): a subshell that
  // settled it settled it for itself only (`cd missing; (ls); cat >> b` still
  // writes where the failed cd left this shell).
  const frames = [];
  const saved = [];
  const leave = () => {
    frames.pop();
    const s = saved.pop();
    ctx.cwd = s.cwd;
    ctx.pendingCd = s.pendingCd;
  };
  const compounds = []; // the directory each open if/while/until/for/select/case began in
  parsed.commands.forEach((cmd, i) => {
    const f = cmd.frames ?? [];
    let k = 0;
    while (k < frames.length && k < f.length && frames[k] === f[k]) k++;
    while (frames.length > k) leave();
    while (frames.length < f.length) {
      saved.push({ cwd: ctx.cwd, pendingCd: ctx.pendingCd });
      frames.push(f[frames.length]);
    }
    settleUncertainCd(cmd, ctx);
    for (const kw of compoundKeywords(cmd)) {
      if (COMPOUND_CLOSERS.has(kw)) {
        const began = compounds.pop();
        if (began === undefined || ctx.cwd !== began) ctx.cwd = null;
      } else {
        if (COMPOUND_END[kw] === "done" && compoundMoves(parsed.commands, i)) ctx.cwd = null;
        compounds.push(ctx.cwd);
      }
    }
    classifySimple(cmd, ctx, effects);
  });
  while (frames.length) leave();
  return effects;
}

// ---------------------------------------------------------------------------
// From effects to actions

function globRegex(pattern) {
  let re = "^";
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i];
    if (c === "*") re += "[^/]*";
    else if (c === "?") re += "[^/]";
    else if (c === "[") {
      const j = pattern.indexOf("]", i + 1);
      if (j < 0) re += "\\[";
      else {
        re += "[" + pattern.slice(i + 1, j).replace(/^!/, "^").replace(/\\/g, "\\\\") + "]";
        i = j;
      }
    } else if (c === "{") {
      const j = pattern.indexOf("}", i + 1);
      if (j < 0) re += "\\{";
      else {
        re += "(?:" + pattern.slice(i + 1, j).split(",").map((a) => a.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")).join("|") + ")";
        i = j;
      }
    } else re += c.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  }
  return new RegExp(re + "$");
}

/** Expand a glob whose wildcards are all in the last component; null when it can't. */
function expandGlob(glob, cwd, home) {
  const slash = glob.lastIndexOf("/");
  const dirPart = slash < 0 ? "." : glob.slice(0, slash) || "/";
  const namePart = slash < 0 ? glob : glob.slice(slash + 1);
  if (/[*?[{]/.test(dirPart) || namePart === "") return null;
  const dir = resolvePath(dirPart, cwd, { home });
  if (dir === null) return null;
  let names;
  try {
    names = fs.readdirSync(dir);
  } catch {
    return null;
  }
  const re = globRegex(namePart);
  const hidden = namePart.startsWith(".");
  const out = names.filter((n) => (hidden || !n.startsWith(".")) && re.test(n)).map((n) => path.join(dirPart, n));
  return out.length > 0 && out.length <= 500 ? out : null;
}

function finishEffect(e, config) {
  if (e.glob && !e.unknownTarget && e.cwd != null) {
    const matches = expandGlob(e.glob, e.cwd, config.home);
    if (matches) return matches.map((m) => finishOne({ ...e, raw: m, glob: undefined, globOf: e.glob }, config));
    // no match (or too many): judge the directory the glob lives in
    return [finishOne({ ...e, contents: true }, config)];
  }
  return [finishOne(e, config)];
}

function finishOne(e, config) {
  const out = { action: null, op: e.op, reason: e.reason };
  if (e.command !== undefined) out.command = e.command;
  if (e.op === "network") {
    out.action = "network";
    out.domain = e.domain ?? null;
    return out;
  }
  if (e.op === "exec") {
    out.action = "shell";
    return out;
  }
  if (e.op === "connector") {
    out.action = "connector";
    return out;
  }
  // a path effect
  let resolved = null;
  if (!e.unknownTarget && e.raw != null && (e.cwd != null || path.isAbsolute(e.raw) || e.raw.startsWith("~"))) {
    resolved = resolvePath(e.raw, e.cwd ?? "/", { home: config.home, noFollowLast: e.op === "delete" || e.op === "move" });
  }
  out.path = resolved;
  if (e.glob) out.glob = e.glob;
  if (e.globOf) out.glob = e.globOf;
  if (resolved === null) {
    out.action = "outside-scope";
    out.unresolved = e.raw ?? null;
    out.reason = `${e.reason}; the target cannot be determined before it runs`;
    return out;
  }
  const inScope = config.scopeDirs.some((d) => isInside(resolved, d));
  const inReadonly = config.readonlyDirs.some((d) => isInside(resolved, d));
  // Deleting or moving a scope root itself is outside the task's business
  // (a glob's base directory is not itself the target).
  const isRoot = !e.contents && config.scopeDirs.some((d) => resolved === d);
  if (e.op === "read") out.action = inScope || inReadonly ? "read" : "outside-scope";
  else if (!inScope || (isRoot && (e.op === "delete" || e.op === "move"))) out.action = "outside-scope";
  else out.action = e.op; // write | delete | move
  return out;
}

function dedupe(effects) {
  const seen = new Set();
  const out = [];
  for (const e of effects) {
    const key = JSON.stringify([e.action, e.op, e.path ?? null, e.domain ?? null, e.command ?? null, e.unresolved ?? null]);
    if (seen.has(key)) continue;
    seen.add(key);
    out.push(e);
  }
  return out;
}

const READ_TOOLS = new Set(["read", "ls", "grep", "find"]);
const WRITE_TOOLS = new Set(["write", "edit"]);
// Tools with no effect outside the conversation: `ask_user` (../ask-user.ts)
// only asks the person a question, so asking permission first would be a
// second dialog for nothing. pi's `codemode` acts only through the tools its
// script calls, and each of those calls comes through this gate itself
// (tool_call fires for nested calls: tests/vm/test_vm_codemode.py);
// `tool_search` only declares tools. Exact names only; other extension tools
// stay `connector`.
const NO_EFFECT_TOOLS = new Set(["ask_user", "codemode", "tool_search"]);

/**
 * Classify one pi tool call.
 * Returns { action, tool, effects, paths, command, cwd, needsDecision, summary }.
 */
export function classifyToolCall(toolName, input, { cwd, config }) {
  const args = input && typeof input === "object" ? input : {};
  let raw = [];
  let command = null;
  if (READ_TOOLS.has(toolName)) {
    const p = typeof args.path === "string" && args.path.length ? args.path : ".";
    raw.push(effect("read", { raw: p, cwd, reason: `${toolName} tool` }));
  } else if (WRITE_TOOLS.has(toolName)) {
    const p = typeof args.path === "string" ? args.path : null;
    raw.push(effect("write", { raw: p, cwd, reason: toolName === "edit" ? "edits a file" : "writes a file", unknownTarget: p === null }));
  } else if (toolName === "bash") {
    command = typeof args.command === "string" ? args.command : "";
    // a `<` redirect anywhere (not a heredoc's `<<`), or exec, can point a descriptor at a file
    const fdRisk = /(^|[^<])<(?!<)|\bexec\b/.test(command);
    raw = classifyCommandEffects(command, { cwd, home: config.home, depth: 0, fdRisk, line: { linksMade: false } });
    if (raw.length === 0) raw.push(effect("read", { raw: ".", cwd, command, reason: "no side effects found" }));
  } else if (NO_EFFECT_TOOLS.has(toolName)) {
    // no effects: action "read", no decision needed
  } else {
    raw.push(effect("connector", { reason: `tool ${toolName}` }));
  }
  const effects = dedupe(raw.flatMap((e) => finishEffect(e, config)));
  let action = "read";
  for (const e of effects) if (SEVERITY[e.action] > SEVERITY[action]) action = e.action;
  const paths = unique(effects.filter((e) => e.path).map((e) => e.path));
  const autoAllow = new Set(["read", ...config.autoAllow]);
  const needsDecision = effects.some((e) => !autoAllow.has(e.action));
  return { action, tool: toolName, effects, paths, command, cwd, needsDecision };
}

// ---------------------------------------------------------------------------
// The select dialog

const ACTION_LABEL = {
  read: "read files",
  write: "change files",
  delete: "delete files",
  move: "move or rename files",
  "outside-scope": "touch files outside the task's folders",
  network: "use the network",
  shell: "run a command",
  connector: "use a tool",
};

function clip(s, n) {
  return s.length > n ? s.slice(0, n - 1) + "…" : s;
}

/** JSON whose text never contains `<`, so the close marker cannot appear inside it. */
export function safeJson(obj) {
  return JSON.stringify(obj).replace(/</g, "\\u003c").replace(/\u2028/g, "\\u2028").replace(/\u2029/g, "\\u2029");
}

/** The payload object (what goes between the markers). */
export function buildPayload(result, { toolCallId, taskId }) {
  return {
    v: PROTOCOL_VERSION,
    kind: "piwork.permission",
    action: result.action,
    tool: result.tool,
    toolCallId: toolCallId ?? null,
    taskId: taskId ?? null,
    cwd: result.cwd ?? null,
    command: result.command,
    paths: result.paths,
    effects: result.effects,
  };
}

/** The human question (first lines of the title). */
export function buildQuestion(result) {
  const lines = [`The agent wants to ${ACTION_LABEL[result.action] ?? result.action}.`];
  if (result.command !== null && result.command !== undefined) lines.push(`Command: ${clip(result.command, 600)}`);
  else lines.push(`Tool: ${result.tool}`);
  const notable = result.effects.filter((e) => e.action !== "read");
  for (const e of notable.slice(0, 8)) {
    const target = e.path ?? e.domain ?? e.unresolved ?? (e.action === "shell" ? "" : "(unknown target)");
    lines.push(`- ${e.action}: ${target ? clip(String(target), 200) + " — " : ""}${e.reason}`);
  }
  if (notable.length > 8) lines.push(`- … and ${notable.length - 8} more`);
  lines.push("Allow?");
  return lines.join("\n");
}

/** Title for ctx.ui.select: human question, blank line, marked JSON block. */
export function buildTitle(result, meta) {
  return `${buildQuestion(result)}\n\n${MARKER_OPEN}${safeJson(buildPayload(result, meta))}${MARKER_CLOSE}`;
}

export function isAllowChoice(choice) {
  return choice === OPTIONS.ALLOW_ONCE || choice === OPTIONS.ALWAYS_FOLDER || choice === OPTIONS.ALWAYS_EVERYWHERE;
}

/** The tool error the model sees after a denial or a cancelled dialog. */
export function denialReason(result, choice) {
  const what = result.command != null ? `the command \`${clip(result.command, 300)}\`` : `the ${result.tool} call${result.paths.length ? " on " + result.paths.slice(0, 3).join(", ") : ""}`;
  if (choice === undefined || choice === null) {
    return `Permission request for ${what} (${result.action}) was cancelled before the user answered (the task was stopped or aborted). It did not run. Do not retry it unless the user asks you to.`;
  }
  return `Permission denied by the user: ${what} (${result.action}) was not run. Do not retry the same action or work around the denial with a different command; continue without it or ask the user how to proceed.`;
}
