// A file browser for one environment (docs/API.md, "Files"): list a
// directory, view a text file, download a file, upload files into the
// directory shown. File names and contents are the environment's: text only.

import { type FileEntry, enc, getJson, query, request } from "./api";
import { button, el, replace, setText } from "./dom";
import { messageOf } from "./errors";
import { bytes, dateTime } from "./format";

/** What the viewer shows of a file (the rest: download it). */
const VIEW_BYTES = 1 << 20;
/** moatd answers at most 8 MiB per read. */
const READ_CHUNK = 8 << 20;

function join(dir: string, name: string): string {
  return dir.endsWith("/") ? dir + name : `${dir}/${name}`;
}

function parent(path: string): string {
  const at = path.replace(/\/+$/, "").lastIndexOf("/");
  return at <= 0 ? "/" : path.slice(0, at);
}

export function openFiles(envId: string, start = "/workspace"): { node: HTMLElement } {
  const base = `/v1/environments/${enc(envId)}/files`;
  let dir = start;
  const pathInput = el("input", { type: "text", class: "path", value: start, "data-testid": "files-path", "aria-label": "directory" });
  const status = el("div", { class: "files-status", "data-testid": "files-status", role: "status" });
  const rows = el("tbody", { "data-testid": "files-entries" });
  const viewerHead = el("div", { class: "viewer-head" });
  const viewerText = el("pre", { class: "viewer-text", "data-testid": "file-view" });
  const viewer = el("div", { class: "viewer", hidden: true }, viewerHead, viewerText);
  const upload = el("input", { type: "file", multiple: true, "data-testid": "files-upload", "aria-label": "upload files" });

  const fail = (what: string, e: unknown) => {
    setText(status, `${what}: ${messageOf(e)}`);
    status.classList.add("error");
  };
  const ok = (text: string) => {
    setText(status, text);
    status.classList.remove("error");
  };

  const list = async (path: string) => {
    ok(`listing ${path}…`);
    try {
      const res = await getJson<{ path: string; entries: FileEntry[] }>(`${base}/list${query({ path })}`);
      dir = res.path || path;
      pathInput.value = dir;
      const entries = [...res.entries].sort((a, b) => (a.type === "dir" ? 0 : 1) - (b.type === "dir" ? 0 : 1) || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
      replace(
        rows,
        ...entries.map((e) => {
          const full = join(dir, e.name);
          const name = button(e.type === "dir" ? `${e.name}/` : e.name, { class: "link file-name", "data-testid": "file-entry", "data-type": e.type }, () =>
            e.type === "dir" ? list(full) : view(full, e.size),
          );
          const mode = typeof e.mode === "number" ? (e.mode & 0o7777).toString(8).padStart(4, "0") : String(e.mode);
          const mtime = typeof e.mtime === "number" ? dateTime(e.mtime * 1000) : dateTime(e.mtime);
          return el(
            "tr",
            {},
            el("td", {}, name),
            el("td", {}, e.type),
            el("td", { class: "num" }, e.type === "file" ? bytes(e.size) : ""),
            el("td", { class: "mono" }, mode),
            el("td", {}, mtime),
            el("td", {}, e.type === "file" ? button("download", { class: "link", "data-testid": "file-download" }, () => download(full)) : ""),
          );
        }),
      );
      ok(`${entries.length} entries in ${dir}`);
    } catch (e) {
      fail(`list ${path}`, e);
    }
  };

  const view = async (path: string, size: number) => {
    ok(`reading ${path}…`);
    try {
      const res = await request("GET", `${base}${query({ path, length: VIEW_BYTES })}`);
      const data = new Uint8Array(await res.arrayBuffer());
      replace(viewerHead, el("b", {}, path), ` · ${bytes(size)} `, button("download", { class: "link" }, () => download(path)), " ", button("close", { class: "link" }, () => (viewer.hidden = true)));
      try {
        viewerText.textContent = new TextDecoder("utf-8", { fatal: true }).decode(data) + (size > data.length ? `\n… (${bytes(size - data.length)} more: download the file)` : "");
        viewerText.classList.remove("muted");
      } catch {
        viewerText.textContent = `not UTF-8 text (${bytes(size)}): download it to look inside`;
        viewerText.classList.add("muted");
      }
      viewer.hidden = false;
      ok(`read ${path}`);
    } catch (e) {
      fail(`read ${path}`, e);
    }
  };

  const download = async (path: string) => {
    ok(`downloading ${path}…`);
    try {
      const parts: ArrayBuffer[] = [];
      for (let offset = 0; ; ) {
        const res = await request("GET", `${base}${query({ path, offset, length: READ_CHUNK })}`);
        const chunk = await res.arrayBuffer();
        parts.push(chunk);
        offset += chunk.byteLength;
        if (chunk.byteLength < READ_CHUNK) break;
      }
      const url = URL.createObjectURL(new Blob(parts, { type: "application/octet-stream" }));
      const a = el("a", { href: url, download: path.slice(path.lastIndexOf("/") + 1) || "file" });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60_000);
      ok(`downloaded ${path}`);
    } catch (e) {
      fail(`download ${path}`, e);
    }
  };

  const uploadFiles = async () => {
    const files = [...(upload.files ?? [])];
    for (const f of files) {
      const path = join(dir, f.name);
      ok(`uploading ${path} (${bytes(f.size)})…`);
      try {
        await request("PUT", `${base}${query({ path })}`, { body: f });
      } catch (e) {
        fail(`upload ${path}`, e);
        return;
      }
    }
    upload.value = "";
    await list(dir);
    if (files.length) ok(`uploaded ${files.length} file${files.length === 1 ? "" : "s"} to ${dir}`);
  };

  const form = el("form", { class: "files-bar" }, button("Up", { "data-testid": "files-up" }, () => list(parent(dir))), pathInput, el("button", { type: "submit" }, "List"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    void list(pathInput.value.trim() || "/");
  });
  const uploadBar = el("div", { class: "files-upload" }, el("label", {}, "Upload into this directory: ", upload), button("Upload", { "data-testid": "files-upload-button" }, uploadFiles));

  const node = el(
    "div",
    { class: "files", "data-testid": "files" },
    form,
    uploadBar,
    status,
    el("table", { class: "files-table" }, el("thead", {}, el("tr", {}, el("th", {}, "name"), el("th", {}, "type"), el("th", {}, "size"), el("th", {}, "mode"), el("th", {}, "modified"), el("th", {}))), rows),
    viewer,
  );
  void list(start);
  return { node };
}
