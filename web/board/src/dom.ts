// The one way the board makes elements. Everything shown comes from the API
// or from inside an environment (labels, argv, output, file names, model
// text) and is untrusted, so it only ever becomes a text node or an
// attribute value: no markup is parsed from data anywhere in the board.

export type Child = Node | string | number | null | undefined | false;
export type Attrs = Record<string, string | number | boolean | null | undefined>;

/**
 * `el("button", {type: "button", "data-testid": "x"}, "Approve")`. An
 * attribute that is false, null or undefined is left out; true sets it
 * empty. Event handler attributes are refused: handlers go through
 * addEventListener (and the Content-Security-Policy forbids inline ones).
 */
export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Attrs = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  append(node, ...children);
  return node;
}

const SVG_NS = "http://www.w3.org/2000/svg";

/** An SVG element (sparklines, the fleet plot), attributes only. */
export function svg<K extends keyof SVGElementTagNameMap>(
  tag: K,
  attrs: Attrs = {},
  ...children: Child[]
): SVGElementTagNameMap[K] {
  const node = document.createElementNS(SVG_NS, tag);
  setAttrs(node, attrs);
  append(node, ...children);
  return node;
}

function setAttrs(node: Element, attrs: Attrs): void {
  for (const [name, value] of Object.entries(attrs)) {
    if (/^on/i.test(name)) throw new Error(`el: event handler attribute ${name}`);
    if (value === false || value === null || value === undefined) continue;
    node.setAttribute(name, value === true ? "" : String(value));
  }
}

export function append(parent: Node, ...children: Child[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    parent.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
  }
}

/** Replaces every child of `parent`. */
export function replace(parent: Node, ...children: Child[]): void {
  while (parent.firstChild) parent.removeChild(parent.firstChild);
  append(parent, ...children);
}

/** Sets a text node's or element's text only when it changed (no layout work otherwise). */
export function setText(node: Node, text: string): void {
  if (node.textContent !== text) node.textContent = text;
}

export function on<K extends keyof HTMLElementEventMap>(
  target: HTMLElement,
  type: K,
  handler: (ev: HTMLElementEventMap[K]) => void,
): void {
  target.addEventListener(type, handler);
}

/** A button that runs `action`; while its promise is pending the button is disabled. */
export function button(label: string, attrs: Attrs, action: () => unknown): HTMLButtonElement {
  const b = el("button", { type: "button", ...attrs }, label);
  b.addEventListener("click", () => {
    const result = action();
    if (result instanceof Promise) {
      b.disabled = true;
      void result.finally(() => {
        b.disabled = false;
      });
    }
  });
  return b;
}

export function byId<T extends HTMLElement>(id: string): T {
  const node = document.getElementById(id);
  if (!node) throw new Error(`no element #${id}`);
  return node as T;
}
