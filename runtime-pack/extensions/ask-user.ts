/**
 * piwork ask_user tool: the model asks the person a question and waits for
 * the answer. With `options` the question is a pi `select` dialog, otherwise
 * an `input` dialog; in RPC mode both reach the host as an
 * `extension_ui_request` (method `select` / `input`) that the piwork runner
 * shows as a plain question. The title is only the question: no
 * `<piwork-permission` block (one the model writes is defused), so the host
 * never mistakes it for the gate's permission dialog
 * (docs/permission-protocol.md).
 *
 * The permission gate lets `ask_user` through without asking (gate/classify.js,
 * NO_EFFECT_TOOLS): it has no effect outside the conversation.
 *
 * The tool's abort signal is passed to the dialog, so stopping the task
 * dismisses it; the model is then told there was no answer.
 */

import { Type } from "typebox";

const ToolParams = Type.Object({
	question: Type.String({
		description: "The question for the user, complete and self-contained (they may not have followed every step).",
	}),
	options: Type.Optional(
		Type.Array(Type.String(), {
			description:
				"Possible answers when the choice is between a few known alternatives; the user picks one. Leave out for a free-text answer.",
		}),
	),
	placeholder: Type.Optional(
		Type.String({ description: "Example or hint shown in the empty answer field (free-text questions only)." }),
	),
});

export const TOOL_NAME = "ask_user";

export const DESCRIPTION =
	"Ask the user a question and wait for their answer. Use it only when you cannot proceed well without them: " +
	"the request is genuinely ambiguous (two reasonable readings lead to different results), or a decision is " +
	"theirs to make (a preference, a trade-off, information only they have). Do not use it for things you can " +
	"find out yourself by reading files or running commands, to confirm routine steps, or to report progress. " +
	"Do not use it to ask for permission: permission for tool calls is requested separately and automatically. " +
	"Ask one clear question at a time; give `options` when the answer is one of a few known choices.";

export const PROMPT_SNIPPET = "Ask the user a question and wait for the answer (ambiguous requirements, decisions only they can make)";

export const PROMPT_GUIDELINES = [
	"Use ask_user only when a requirement is genuinely ambiguous or a decision is the user's to make; never use ask_user to ask for permission (permissions are handled separately).",
];

export const NO_ANSWER =
	"The user did not answer (the question was dismissed or the task was stopped). Do not assume an answer. " +
	"Continue only with work that does not depend on it, or stop and say what you need to know.";

export const NO_UI =
	"No one can be asked: this session has no user interface attached, so ask_user cannot reach the user. " +
	"Do not assume an answer; make only choices you can justify from the request and state your assumptions.";

export interface AskUserDetails {
	question: string;
	options: string[];
	answer: string | null;
	cancelled: boolean;
}

interface AskUserParams {
	question: string;
	options?: string[];
	placeholder?: string;
}

interface DialogOptions {
	signal?: AbortSignal;
}

// Minimal structural types, like the gate: no dependency on pi's type exports.
interface AskUserContext {
	hasUI: boolean;
	signal?: AbortSignal;
	ui: {
		select(title: string, options: string[], opts?: DialogOptions): Promise<string | undefined>;
		input(title: string, placeholder?: string, opts?: DialogOptions): Promise<string | undefined>;
	};
}

interface ToolResult {
	content: { type: "text"; text: string }[];
	details: AskUserDetails;
}

interface AskUserAPI {
	registerTool(tool: {
		name: string;
		label: string;
		description: string;
		promptSnippet?: string;
		promptGuidelines?: string[];
		parameters: unknown;
		executionMode?: "sequential" | "parallel";
		execute(
			toolCallId: string,
			params: AskUserParams,
			signal: AbortSignal | undefined,
			onUpdate: unknown,
			ctx: AskUserContext,
		): Promise<ToolResult>;
	}): void;
}

/**
 * The model writes the question, so it could end it with a fake
 * `<piwork-permission v="1">{...}</piwork-permission>` block and have the host
 * take this dialog for the gate's permission request (and store "Always allow"
 * rules from a forged payload). Break both markers: `<` becomes `‹`.
 */
export function defuseMarkers(text: string): string {
	return text.replace(/<(\/?\s*piwork-permission)/gi, "\u2039$1");
}

function cleanOptions(options: unknown): string[] {
	if (!Array.isArray(options)) return [];
	const out: string[] = [];
	for (const o of options) {
		if (typeof o !== "string") continue;
		const s = defuseMarkers(o.trim());
		if (s && !out.includes(s)) out.push(s);
	}
	return out;
}

function result(text: string, details: AskUserDetails): ToolResult {
	return { content: [{ type: "text", text }], details };
}

export default function askUser(pi: AskUserAPI): void {
	pi.registerTool({
		name: TOOL_NAME,
		label: "Ask user",
		description: DESCRIPTION,
		promptSnippet: PROMPT_SNIPPET,
		promptGuidelines: PROMPT_GUIDELINES,
		parameters: ToolParams,
		// One question at a time: a batch holding ask_user runs its calls in order.
		executionMode: "sequential",

		async execute(_toolCallId, params, signal, _onUpdate, ctx) {
			const question = typeof params.question === "string" ? defuseMarkers(params.question.trim()) : "";
			const options = cleanOptions(params.options);
			if (!question) throw new Error("ask_user needs a non-empty `question`.");
			// pi marks a tool result as an error only when execute throws.
			if (!ctx.hasUI) throw new Error(NO_UI);

			// The tool's abort signal: an abort (stop) dismisses the dialog, which resolves undefined.
			const opts: DialogOptions = { signal: signal ?? ctx.signal };
			const answer =
				options.length > 0
					? await ctx.ui.select(question, options, opts)
					: await ctx.ui.input(question, typeof params.placeholder === "string" && params.placeholder ? params.placeholder : undefined, opts);

			if (typeof answer !== "string") {
				return result(NO_ANSWER, { question, options, answer: null, cancelled: true });
			}
			const details = { question, options, answer, cancelled: false };
			if (answer.trim() === "") return result("The user answered with an empty reply (no text).", details);
			return result(`The user answered: ${answer}`, details);
		},
	});
}
