/**
 * piwork project extension: says what pi loaded from the task's folder, and
 * keeps the folder's context files out when the person turned project trust off.
 *
 * Project trust itself is pi's (`defaultProjectTrust` in the agent dir's
 * settings.json, which the host writes: "always" or "never"); it decides the
 * folder's .pi settings, MCP servers, extensions, skills and prompt templates.
 * pi loads AGENTS.md/CLAUDE.md regardless of trust, so with trust off
 * (PIWORK_TRUST_PROJECT=0) they are taken out of the system prompt's inputs here,
 * before the first model call.
 *
 * The report goes to the host once per session, at the first run, as a
 * `setStatus` under the key `piwork-project` whose text is JSON:
 * {v: 1, trusted, settings, contextFiles, skills, prompts, extensions, mcpServers}, paths
 * relative to the working directory. The host shows it as a line for the
 * person (piwork/pisettings.py project_report_text); it is information,
 * never a decision.
 *
 * "extensions" are the folder's extension entry points pi discovers
 * (.pi/extensions: *.ts, *.js, DIR/index.ts|js, DIR/package.json), plus any other
 * extension a tool or command came from; a failed load shows up as pi's own
 * extension_error.
 */

import fs from "node:fs";
import path from "node:path";

export const REPORT_KEY = "piwork-project";

interface SourceInfo {
	path?: string;
	scope?: string;
}
interface PromptOptions {
	cwd?: string;
	contextFiles?: { path: string }[];
	skills?: { name?: string; filePath?: string }[];
}
interface ProjectContext {
	cwd: string;
	hasUI: boolean;
	isProjectTrusted?: () => boolean;
	ui: { setStatus(key: string, text: string | undefined): void };
}
interface ProjectAPI {
	on(
		event: "before_agent_start",
		handler: (event: { systemPromptOptions?: PromptOptions }, ctx: ProjectContext) => Promise<unknown> | unknown,
	): void;
	getCommands?: () => { name: string; source: string; sourceInfo?: SourceInfo }[];
	getAllTools?: () => { name: string; namespace?: { name?: string }; sourceInfo?: SourceInfo }[];
}

const LIST_LIMIT = 100;

function rel(cwd: string, p: string): string {
	const r = path.relative(cwd, p);
	return r && !r.startsWith("..") && !path.isAbsolute(r) ? r : p;
}

/** The folder's extension entry points, as pi discovers them (one level deep). */
export function projectExtensions(cwd: string): string[] {
	const dir = path.join(cwd, ".pi", "extensions");
	let entries: fs.Dirent[];
	try {
		entries = fs.readdirSync(dir, { withFileTypes: true });
	} catch {
		return [];
	}
	const out: string[] = [];
	for (const e of entries.sort((a, b) => a.name.localeCompare(b.name))) {
		const p = path.join(dir, e.name);
		if (e.isFile() && /\.(ts|js)$/.test(e.name)) out.push(p);
		else if (e.isDirectory()) {
			for (const f of ["index.ts", "index.js", "package.json"]) {
				if (fs.existsSync(path.join(p, f))) {
					out.push(f === "package.json" ? p : path.join(p, f));
					break;
				}
			}
		}
	}
	return out;
}

/** The servers the folder's .pi/mcp.json names (pi reads it only in a trusted project). */
export function projectMcpServers(cwd: string): string[] {
	try {
		const doc = JSON.parse(fs.readFileSync(path.join(cwd, ".pi", "mcp.json"), "utf8"));
		const servers = doc && typeof doc.mcpServers === "object" && doc.mcpServers ? doc.mcpServers : {};
		return Object.keys(servers);
	} catch {
		return [];
	}
}

function unique(items: string[]): string[] {
	return [...new Set(items)].slice(0, LIST_LIMIT);
}

export function buildReport(pi: ProjectAPI, ctx: ProjectContext, opts: PromptOptions | undefined, trusted: boolean) {
	const cwd = opts?.cwd || ctx.cwd || process.cwd();
	const commands = typeof pi.getCommands === "function" ? pi.getCommands() : [];
	const tools = typeof pi.getAllTools === "function" ? pi.getAllTools() : [];
	const fromProject = (s?: SourceInfo) => s?.scope === "project";
	const extensions = trusted ? projectExtensions(cwd) : [];
	for (const item of [...commands.filter((c) => c.source === "extension"), ...tools]) {
		if (fromProject(item.sourceInfo) && item.sourceInfo?.path) extensions.push(item.sourceInfo.path);
	}
	const mcp = trusted ? projectMcpServers(cwd) : [];
	for (const t of tools) {
		if (t.name.startsWith("mcp__") && t.namespace?.name) mcp.push(String(t.namespace.name).replace(/^mcp__/, ""));
	}
	const settings = path.join(cwd, ".pi", "settings.json");
	return {
		v: 1,
		trusted,
		settings: trusted && fs.existsSync(settings) ? [rel(cwd, settings)] : [],
		contextFiles: unique((opts?.contextFiles ?? []).map((f) => rel(cwd, f.path))),
		skills: unique((opts?.skills ?? []).map((s) => String(s.name ?? s.filePath ?? "?"))),
		prompts: unique(commands.filter((c) => c.source === "prompt").map((c) => `/${c.name}`)),
		extensions: unique(extensions.map((p) => rel(cwd, p))),
		mcpServers: unique(mcp),
	};
}

export default function project(pi: ProjectAPI): void {
	let reported = false;
	pi.on("before_agent_start", (event, ctx) => {
		const trusted = process.env.PIWORK_TRUST_PROJECT !== "0";
		const opts = event.systemPromptOptions;
		// pi loads context files whatever the trust: with trust off, none reaches the model.
		if (!trusted && opts && Array.isArray(opts.contextFiles)) opts.contextFiles.splice(0);
		if (reported || !ctx.hasUI) return undefined;
		reported = true;
		try {
			ctx.ui.setStatus(REPORT_KEY, JSON.stringify(buildReport(pi, ctx, opts, trusted)));
		} catch (err) {
			ctx.ui.setStatus(REPORT_KEY, JSON.stringify({ v: 1, trusted, error: String(err) }));
		}
		return undefined;
	});
}
