/**
 * piwork permission gate: every tool call is classified (see gate/classify.js)
 * and, unless it is a read inside the task's folders, the host is asked through
 * an `extension_ui_request` select whose title carries a machine-readable block.
 * The host answers from its policy or asks the person; see
 * docs/permission-protocol.md.
 *
 * Fail-safe: if classification throws, the call is sent to the host as a
 * "shell"/"connector" request rather than allowed.
 */

import {
	buildTitle,
	classifyToolCall,
	denialReason,
	isAllowChoice,
	loadConfig,
	OPTION_LIST,
} from "./gate/classify.js";

// Minimal structural types: the gate must not depend on pi's type exports
// (jiti strips types, but keep the file self-explanatory).
interface ToolCallEvent {
	toolName: string;
	toolCallId: string;
	input: Record<string, unknown>;
}
interface GateContext {
	cwd: string;
	hasUI: boolean;
	signal?: AbortSignal;
	ui: {
		select(title: string, options: string[], opts?: { signal?: AbortSignal }): Promise<string | undefined>;
	};
}
interface GateAPI {
	on(event: "tool_call", handler: (event: ToolCallEvent, ctx: GateContext) => Promise<unknown>): void;
}

type Classified = ReturnType<typeof classifyToolCall>;

function fallback(event: ToolCallEvent, cwd: string, err: unknown): Classified {
	const command = event.toolName === "bash" && typeof event.input?.command === "string" ? (event.input.command as string) : null;
	const action = event.toolName === "bash" ? "shell" : "connector";
	return {
		action,
		tool: event.toolName,
		cwd,
		command,
		paths: [],
		needsDecision: true,
		effects: [{ action, op: action === "shell" ? "exec" : "connector", reason: `the gate could not classify this call (${String(err)})`, command: command ?? undefined }],
	} as unknown as Classified;
}

export default function permissionGate(pi: GateAPI): void {
	const config = loadConfig(process.env);

	pi.on("tool_call", async (event, ctx) => {
		const cwd = ctx.cwd || process.cwd();
		let result: Classified;
		try {
			result = classifyToolCall(event.toolName, event.input, { cwd, config });
		} catch (err) {
			result = fallback(event, cwd, err);
		}
		if (!result.needsDecision) return undefined;

		if (!ctx.hasUI) {
			return { block: true, reason: `Blocked: ${result.action} needs the user's permission and no one can be asked. Do not retry.` };
		}
		const title = buildTitle(result, { toolCallId: event.toolCallId, taskId: config.taskId });
		// ctx.signal: an abort (stop) dismisses the dialog and resolves it as undefined.
		const choice = await ctx.ui.select(title, [...OPTION_LIST], { signal: ctx.signal });
		if (isAllowChoice(choice)) return undefined;
		return { block: true, reason: denialReason(result, choice) };
	});
}
