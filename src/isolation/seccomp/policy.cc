#include "isolation/seccomp/policy.h"

#include <seccomp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <sstream>
#include <vector>

#include "common/unique_fd.h"

extern const char kMoatDefaultSeccompPolicy[];
extern const char kMoatdSeccompPolicy[];

namespace moat::isolation::seccomp {
namespace {

struct ErrnoName {
  const char* name;
  int value;
};
constexpr ErrnoName kErrnos[] = {
    {"EPERM", EPERM}, {"ENOSYS", ENOSYS}, {"EACCES", EACCES}, {"EINVAL", EINVAL}, {"ENOTSUP", ENOTSUP}};

Error lineError(int line, const std::string& what) {
  return Error::make(Code::kInvalidArgument, "seccomp policy line " + std::to_string(line) + ": " + what);
}

}  // namespace

const std::string& defaultPolicyText() {
  static const std::string text(kMoatDefaultSeccompPolicy);
  return text;
}

const std::string& moatdPolicyText() {
  static const std::string text(kMoatdSeccompPolicy);
  return text;
}

Result<Policy> parsePolicy(const std::string& text) {
  Policy policy;
  std::istringstream in(text);
  std::string raw;
  int lineNo = 0;
  while (std::getline(in, raw)) {
    ++lineNo;
    std::string why;
    auto hash = raw.find('#');
    if (hash != std::string::npos) {
      why = raw.substr(hash + 1);
      raw = raw.substr(0, hash);
    }
    std::istringstream fields(raw);
    std::vector<std::string> tokens;
    for (std::string t; fields >> t;) tokens.push_back(t);
    if (tokens.empty()) continue;
    Rule rule;
    rule.line = lineNo;
    rule.why = why;
    rule.syscall = tokens[0];
    for (char c : rule.syscall) {
      if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '_')) {
        return lineError(lineNo, "bad syscall name '" + rule.syscall + "'");
      }
    }
    if (tokens.size() < 2) return lineError(lineNo, "missing action for " + rule.syscall);
    if (tokens[1] == "KILL") {
      rule.kill = true;
    } else {
      for (const auto& e : kErrnos) {
        if (tokens[1] == e.name) rule.errnoValue = e.value;
      }
      if (rule.errnoValue == 0) return lineError(lineNo, "unknown action '" + tokens[1] + "'");
    }
    // Conditions, three tokens each: argN has-any MASK | argN == VALUE.
    if ((tokens.size() - 2) % 3 != 0) return lineError(lineNo, "unexpected fields after action");
    for (size_t t = 2; t < tokens.size(); t += 3) {
      const std::string& arg = tokens[t];
      if (arg.size() != 4 || arg.compare(0, 3, "arg") != 0 || arg[3] < '0' || arg[3] > '5') {
        return lineError(lineNo, "expected argN (N in 0..5), got '" + arg + "'");
      }
      Condition c;
      c.argIndex = arg[3] - '0';
      const std::string& number = tokens[t + 2];
      char* end = nullptr;
      if (tokens[t + 1] == "has-any") {
        c.anyBits = std::strtoull(number.c_str(), &end, 0);
        if (*end != '\0' || c.anyBits == 0) return lineError(lineNo, "bad mask '" + number + "'");
      } else if (tokens[t + 1] == "==") {
        errno = 0;
        unsigned long long v = std::strtoull(number.c_str(), &end, 0);
        if (*end != '\0' || number.empty() || errno != 0 || v > 0xffffffffULL) {
          return lineError(lineNo, "bad value '" + number + "' (a 32-bit number)");
        }
        c.equals = true;
        c.value = static_cast<uint32_t>(v);
      } else {
        return lineError(lineNo, "expected 'has-any' or '==', got '" + tokens[t + 1] + "'");
      }
      rule.conditions.push_back(c);
    }
    if (rule.why.find_first_not_of(" \t") == std::string::npos) {
      return lineError(lineNo, rule.syscall + " has no comment saying why it is denied");
    }
    policy.rules.push_back(rule);
  }
  return policy;
}

Result<Program> compile(const Policy& policy) {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (ctx == nullptr) return Error::make(Code::kInternal, "seccomp_init failed");
  struct CtxGuard {
    scmp_filter_ctx c;
    ~CtxGuard() { seccomp_release(c); }
  } guard{ctx};
  // moat sets no_new_privs itself, before loading.
  seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0);

  Program program;
  for (const auto& rule : policy.rules) {
    int nr = seccomp_syscall_resolve_name(rule.syscall.c_str());
    if (nr == __NR_SCMP_ERROR) {
      program.skipped.push_back(rule.syscall);
      continue;
    }
    uint32_t action = rule.kill ? SCMP_ACT_KILL_PROCESS : SCMP_ACT_ERRNO(rule.errnoValue);
    // Conditions hold together (one rule); "any of these bits" is one
    // masked-equality compare per bit, so a mask of several bits makes as
    // many rules, each with the other conditions.
    std::vector<std::vector<scmp_arg_cmp>> alternatives(1);
    for (const auto& c : rule.conditions) {
      auto index = static_cast<unsigned>(c.argIndex);
      if (c.equals) {
        // The low 32 bits only: the high half is masked out of the compare.
        for (auto& cmps : alternatives) cmps.push_back({index, SCMP_CMP_MASKED_EQ, 0xffffffffULL, c.value});
        continue;
      }
      std::vector<std::vector<scmp_arg_cmp>> widened;
      for (int bit = 0; bit < 64; ++bit) {
        uint64_t b = 1ULL << bit;
        if (!(c.anyBits & b)) continue;
        for (auto cmps : alternatives) {
          cmps.push_back({index, SCMP_CMP_MASKED_EQ, b, b});
          widened.push_back(std::move(cmps));
        }
      }
      alternatives = std::move(widened);
    }
    int rc = 0;
    for (const auto& cmps : alternatives) {
      if (rc != 0) break;
      rc = cmps.empty() ? seccomp_rule_add(ctx, action, nr, 0)
                        : seccomp_rule_add_array(ctx, action, nr, static_cast<unsigned>(cmps.size()), cmps.data());
    }
    if (rc != 0) {
      return Error{Code::kInvalidArgument, -rc,
                   "seccomp rule for " + rule.syscall + " (line " + std::to_string(rule.line) + ")"};
    }
  }
  UniqueFd mem(::memfd_create("moat-seccomp", MFD_CLOEXEC));
  if (!mem) return Error::fromErrno("memfd_create");
  int rc = seccomp_export_bpf(ctx, mem.get());
  if (rc != 0) return Error{Code::kInternal, -rc, "seccomp_export_bpf"};
  off_t size = ::lseek(mem.get(), 0, SEEK_END);
  if (size <= 0 || size % sizeof(sock_filter) != 0) return Error::make(Code::kInternal, "odd BPF size");
  program.filter.resize(static_cast<size_t>(size) / sizeof(sock_filter));
  if (::pread(mem.get(), program.filter.data(), static_cast<size_t>(size), 0) != size) {
    return Error::fromErrno("read BPF");
  }
  return program;
}

std::string filterSource(const Program& program, const std::string& name) {
  const std::string filter = "kMoat" + name + "SeccompFilter";
  std::string out =
      "// Generated by moat-seccomp-compile from a policy/seccomp file. Do not edit.\n"
      "#include <linux/filter.h>\n#include <cstddef>\n"
      "extern const sock_filter " +
      filter + "[];\nextern const size_t " + filter + "Length;\nconst sock_filter " + filter + "[] = {\n";
  char line[96];
  for (const auto& f : program.filter) {
    std::snprintf(line, sizeof line, "  {0x%04x, %u, %u, 0x%08x},\n", f.code, f.jt, f.jf, f.k);
    out += line;
  }
  out += "};\nconst size_t " + filter + "Length = " + std::to_string(program.filter.size()) + ";\n";
  return out;
}

}  // namespace moat::isolation::seccomp
