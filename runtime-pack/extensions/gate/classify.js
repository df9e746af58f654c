// Permission-gate classifier: pure ESM, no pi imports, so `node --test` can
// exercise it without a build step. The extension (../permission-gate.ts) is a
// thin adapter around `classifyToolCall` and `buildTitle`.
//
// What the gate no longer does (issue 34, docs/change-sets.md): guess what a
// command will do to the working folder. The guest never writes the person's
// folder; what the agent changed there arrives on the host as a change set,
// decided from its effect (deletes and moves asked with exact paths, what the
// host could run held). Reads and writes in the guest's own file system are
// the task's own. The network is decided by the host's egress proxy, per host
// name. So a tool call asks only when:
//   - it is a tool other than pi's own (a connector): its effects are outside
//     the VM's file system and cannot be undone;
//   - a bash command names a command the person's own rules ask (or refuse)
//     before (`piwork policy add ask shell PREFIX`): the host hands their
//     prefixes to the gate (PIWORK_GATE_ASK_COMMANDS) and decides the request.
// What is left of the classifier is the shell lexer (the full grammar, so the
// commands a line runs, substitutions and `bash -c` strings included, are
// found) and the wrappers it sees through (sudo, env, timeout, xargs...). It
// runs in the guest: a hostile agent can step around it; what must hold is
// enforced on the host. See docs/security-gate.md.
//
// The contract with the host lives in docs/permission-protocol.md; keep the
// two in step (PROTOCOL_VERSION, MARKER, OPTIONS, action names).

import * as os from "node:os";


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

/**
 * PIWORK_TASK_ID            copied into every request
 * PIWORK_GATE_ASK_COMMANDS  JSON list of command prefixes the person's rules ask or
 *                           refuse before (host-derived; anything malformed: none)
 */
export function loadConfig(env = process.env) {
  let askCommands = [];
  try {
    const parsed = JSON.parse(env.PIWORK_GATE_ASK_COMMANDS || "[]");
    if (Array.isArray(parsed)) askCommands = parsed.filter((p) => typeof p === "string" && p.trim().length > 0).map(normalize);
  } catch {
    askCommands = [];
  }
  return { taskId: env.PIWORK_TASK_ID || null, home: env.HOME || os.homedir(), askCommands };
}

function normalize(text) {
  return text.split(/\s+/).filter((w) => w.length > 0).join(" ");
}

/** Prefix match on word boundaries, as the host's rules match (`npm test` matches `npm test -w`). */
export function commandMatches(prefix, command) {
  const c = normalize(command);
  return c === prefix || c.startsWith(prefix + " ");
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
// Commands a line runs

const SAFE_VAR = /^(?:[a-z_][A-Za-z0-9_]*|LC_[A-Z]+|LANG|LANGUAGE|TZ|COLUMNS|LINES|NO_COLOR|FORCE_COLOR|TERM|CI|PYTHONUNBUFFERED|PYTHONDONTWRITEBYTECODE|DEBIAN_FRONTEND)$/;
// `NAME=`, `NAME+=`, `NAME[i]=`: a variable assignment before a command (or alone)
const ASSIGNMENT = /^[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?\+?=/;
// Keywords that may prefix a command.
const KEYWORDS = new Set(["if", "then", "else", "elif", "fi", "do", "done", "while", "until", "!", "{", "}", "esac", "time", "in"]);
// Programs that run the rest of their arguments as a command.
const WRAPPERS = new Set(["nice", "nohup", "time", "command", "builtin", "exec", "stdbuf", "ionice", "timeout", "env", "xargs", "setsid", "unbuffer", "sudo", "doas", "runuser", "pkexec", "chroot", "flock", "watch", "strace", "ltrace"]);
const SHELLS = new Set(["bash", "sh", "zsh", "dash", "ksh", "ash", "fish", "busybox"]);
const MAX_DEPTH = 8;

function text(w) {
  return w.text.replace(/\u0000/g, "$…").replace(/\u0001/g, "$");
}

/**
 * The command lines ``words`` may run: itself, and (through wrappers, whose
 * options are skipped, and `bash -c`/`eval` strings) what it runs. Broad on
 * purpose: a rule the person wrote should ask whenever its command may run.
 */
function commandLines(words, depth, out) {
  let ws = words.filter((w) => !w.procsub);
  while (ws.length && ((KEYWORDS.has(ws[0].text) && !ws[0].quoted) || ASSIGNMENT.test(ws[0].text))) ws = ws.slice(1);
  if (!ws.length) return;
  out.push(ws.map(text).join(" "));
  const name = ws[0].text.split("/").pop();
  // `/usr/bin/git push` is `git push` to a rule
  if (name !== ws[0].text) out.push([name, ...ws.slice(1).map(text)].join(" "));
  if (depth >= MAX_DEPTH) return;
  if (WRAPPERS.has(name) || name === "su") {
    // every later start is a command the wrapper may run (its options are skipped over)
    for (let i = 1; i < ws.length; i++) if (!ws[i].text.startsWith("-")) commandLines(ws.slice(i), depth + 1, out);
  }
  if (SHELLS.has(name) || name === "eval" || name === "su" || name === "source" || name === ".") {
    for (const w of ws.slice(1)) if (!w.text.startsWith("-")) commandsOf(text(w), depth + 1, out);
  }
}

function commandsOf(src, depth, out) {
  const parsed = parseShell(src);
  for (const cmd of parsed.commands) commandLines(cmd.words, depth, out);
  if (depth < MAX_DEPTH) for (const sub of parsed.subs) commandsOf(sub, depth + 1, out);
}

/** Every command line `commandText` may run (top level, substitutions, wrapped, `bash -c`). */
export function commandsIn(commandText) {
  const out = [];
  commandsOf(commandText, 0, out);
  return out;
}


// ---------------------------------------------------------------------------
// A tool call -> what (if anything) the host must decide before it runs

// pi's own tools: their effects stay in the VM (the folder's change sets are decided
// on the host), so they never ask for what they do to files. `ask_user` only asks the
// person a question; `codemode` acts only through the tools its script calls, and each
// of those calls comes through this gate itself (tool_call fires for nested calls:
// tests/vm/test_vm_codemode.py); `tool_search` only declares tools. Exact names only;
// any other tool is a connector.
const OWN_TOOLS = new Set(["read", "ls", "grep", "find", "write", "edit", "bash", "ask_user", "codemode", "tool_search"]);

/**
 * Classify one pi tool call.
 * Returns { action, tool, effects, paths, command, cwd, needsDecision }.
 */
export function classifyToolCall(toolName, input, { cwd, config }) {
  const args = input && typeof input === "object" ? input : {};
  const effects = [];
  let command = null;
  if (toolName === "bash") {
    command = typeof args.command === "string" ? args.command : "";
    if (config.askCommands.length) {
      const seen = new Set();
      for (const line of commandsIn(command)) {
        for (const prefix of config.askCommands) {
          if (commandMatches(prefix, line) && !seen.has(line)) {
            seen.add(line);
            effects.push({ action: "shell", op: "exec", command: line, reason: `a rule of yours asks before \`${prefix}\`` });
          }
        }
      }
    }
  } else if (!OWN_TOOLS.has(toolName)) {
    effects.push({ action: "connector", op: "connector", reason: `tool ${toolName}` });
  }
  let action = "read";
  for (const e of effects) if (SEVERITY[e.action] > SEVERITY[action]) action = e.action;
  return { action, tool: toolName, effects, paths: [], command, cwd, needsDecision: effects.length > 0 };
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
