// The CUDA modules an AOTInductor package loads, unloaded when the model is.
//
// The code AOTInductor generates loads each kernel with cuModuleLoad / cuModuleLoadData the
// first time it runs and, up to torch 2.14 or so, never unloads it: every load of a CUDA
// package leaves its kernels' code in GPU memory and the driver's bookkeeping of them in the
// process, so reloading a model grows both (newer generated code keeps the handles and
// unloads them itself; it is recognised below by its reference to cuModuleUnload).
//
// For a package that does not unload its own, the package library's import slots (GOT
// entries) for cuModuleLoad and cuModuleLoadData are pointed at the two hooks below. A hook
// calls the driver's function and files the new module under the tracker whose library
// made the call (found from the caller's address), and the tracker unloads them when it is
// released, after the library is gone. Only that library's calls are routed: nothing else
// in the process sees the hooks.
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

using LoadFn = int (*)(void** module, const char* path);
using LoadDataFn = int (*)(void** module, const void* image);
using UnloadFn = int (*)(void* module);

struct Driver {
  std::string name;
  LoadFn load = nullptr;
  LoadDataFn load_data = nullptr;
  UnloadFn unload = nullptr;
};

struct Tracker {
  std::string library;  // the package library, by the name it was opened by
  std::vector<void*> modules;
};

std::mutex registry_lock;
Driver driver;                    // set by the first tracker
std::vector<Tracker*> trackers;  // live ones

void record(const void* caller, void* module) {
  Dl_info info{};
  if (!dladdr(caller, &info) || !info.dli_fname) return;
  std::lock_guard<std::mutex> lock(registry_lock);
  for (auto* t : trackers) {
    if (t->library == info.dli_fname) {
      t->modules.push_back(module);
      return;
    }
  }
}

extern "C" int tra_hook_module_load(void** module, const char* path) {
  int rc = driver.load(module, path);
  if (rc == 0 && module) record(__builtin_return_address(0), *module);
  return rc;
}

extern "C" int tra_hook_module_load_data(void** module, const void* image) {
  int rc = driver.load_data(module, image);
  if (rc == 0 && module) record(__builtin_return_address(0), *module);
  return rc;
}

// One import slot of a loaded library: where it is, and the symbol it imports.
struct Slot {
  uintptr_t where;
  std::string symbol;
};

struct Library {
  std::string prefix;  // a loaded object whose path starts with it
  std::string found;   // its path
  std::string opened;  // the name it was opened by (dladdr gives that one)
  std::vector<Slot> slots;
  uintptr_t relro_start = 0, relro_end = 0;
};

#if defined(__x86_64__)
constexpr uint32_t JUMP_SLOT = R_X86_64_JUMP_SLOT, GLOB_DAT = R_X86_64_GLOB_DAT;
#elif defined(__aarch64__)
constexpr uint32_t JUMP_SLOT = R_AARCH64_JUMP_SLOT, GLOB_DAT = R_AARCH64_GLOB_DAT;
#else
#error "import slots are read for x86_64 and aarch64 only"
#endif

// The import slots of the first loaded object under `lib->prefix`.
int find_slots(dl_phdr_info* info, size_t, void* data) {
  auto* lib = static_cast<Library*>(data);
  if (!info->dlpi_name || !info->dlpi_name[0]) return 0;
  // the name it was opened by, or that name with its links resolved (as /proc/self/maps
  // shows it, where the unpacked directory was found)
  std::string name = info->dlpi_name;
  if (name.compare(0, lib->prefix.size(), lib->prefix) != 0) {
    char* real = realpath(info->dlpi_name, nullptr);
    if (!real) return 0;
    name = real;
    std::free(real);
    if (name.compare(0, lib->prefix.size(), lib->prefix) != 0) return 0;
  }
  lib->found = name;
  lib->opened = info->dlpi_name;
  const ElfW(Dyn)* dynamic = nullptr;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_DYNAMIC) dynamic = reinterpret_cast<const ElfW(Dyn)*>(info->dlpi_addr + ph.p_vaddr);
    if (ph.p_type == PT_GNU_RELRO) {
      lib->relro_start = info->dlpi_addr + ph.p_vaddr;
      lib->relro_end = lib->relro_start + ph.p_memsz;
    }
  }
  if (!dynamic) return 1;
  // glibc rewrites these addresses to absolute ones when it loads the object; a loader that
  // does not leaves them relative to its base
  auto absolute = [&](ElfW(Addr) a) { return a < info->dlpi_addr ? a + info->dlpi_addr : a; };
  const ElfW(Sym)* symtab = nullptr;
  const char* strtab = nullptr;
  const ElfW(Rela)* tables[2] = {nullptr, nullptr};
  size_t sizes[2] = {0, 0};
  for (auto* d = dynamic; d->d_tag != DT_NULL; ++d) {
    switch (d->d_tag) {
      case DT_SYMTAB: symtab = reinterpret_cast<const ElfW(Sym)*>(absolute(d->d_un.d_ptr)); break;
      case DT_STRTAB: strtab = reinterpret_cast<const char*>(absolute(d->d_un.d_ptr)); break;
      case DT_JMPREL: tables[0] = reinterpret_cast<const ElfW(Rela)*>(absolute(d->d_un.d_ptr)); break;
      case DT_PLTRELSZ: sizes[0] = d->d_un.d_val; break;
      case DT_RELA: tables[1] = reinterpret_cast<const ElfW(Rela)*>(absolute(d->d_un.d_ptr)); break;
      case DT_RELASZ: sizes[1] = d->d_un.d_val; break;
      default: break;
    }
  }
  if (!symtab || !strtab) return 1;
  for (int t = 0; t < 2; ++t) {
    if (!tables[t]) continue;
    for (size_t i = 0; i < sizes[t] / sizeof(ElfW(Rela)); ++i) {
      const auto& r = tables[t][i];
      auto type = ELF64_R_TYPE(r.r_info);
      auto sym = ELF64_R_SYM(r.r_info);
      if ((type != JUMP_SLOT && type != GLOB_DAT) || sym == 0) continue;
      lib->slots.push_back({info->dlpi_addr + r.r_offset, strtab + symtab[sym].st_name});
    }
  }
  return 1;
}

bool write_slot(const Library& lib, uintptr_t where, void* value) {
  long page = sysconf(_SC_PAGESIZE);
  auto start = where & ~static_cast<uintptr_t>(page - 1);
  if (mprotect(reinterpret_cast<void*>(start), page, PROT_READ | PROT_WRITE) != 0) return false;
  *reinterpret_cast<void**>(where) = value;
  if (where >= lib.relro_start && where < lib.relro_end) mprotect(reinterpret_cast<void*>(start), page, PROT_READ);
  return true;
}

void put(char* err, size_t len, const std::string& what) {
  if (err && len) std::snprintf(err, len, "%s", what.c_str());
}

}  // namespace

extern "C" {

// Tracks the CUDA modules loaded by the library found under `lib_dir` (the directory a
// package was unpacked into; the library must be loaded), resolving the driver's functions
// in `driver_lib` (an already loaded library: "libcuda.so.1"). Returns the tracker, or null
// when there is nothing to track (the library unloads its own modules, or loads none):
// `*routed` is the number of import slots pointed at the hooks. On failure: null, and
// `err` says why.
void* tra_modules_track(const char* lib_dir, const char* driver_lib, int* routed, char* err, size_t len) {
  *routed = 0;
  std::string dir = lib_dir ? lib_dir : "";
  if (dir.empty()) {
    put(err, len, "no directory to find the package library in");
    return nullptr;
  }
  if (dir.back() != '/') dir += '/';
  Library lib;
  lib.prefix = dir;
  dl_iterate_phdr(find_slots, &lib);
  if (lib.found.empty()) {
    put(err, len, "no loaded library under " + dir);
    return nullptr;
  }
  auto imports = [&](const char* name) {
    return std::any_of(lib.slots.begin(), lib.slots.end(), [&](const Slot& s) { return s.symbol == name; });
  };
  if (imports("cuModuleUnload") || (!imports("cuModuleLoad") && !imports("cuModuleLoadData"))) return nullptr;

  std::lock_guard<std::mutex> lock(registry_lock);
  if (driver.name.empty()) {
    void* handle = dlopen(driver_lib, RTLD_NOW | RTLD_NOLOAD);
    if (!handle) {
      put(err, len, std::string(driver_lib) + " is not loaded: " + dlerror());
      return nullptr;
    }
    driver.load = reinterpret_cast<LoadFn>(dlsym(handle, "cuModuleLoad"));
    driver.load_data = reinterpret_cast<LoadDataFn>(dlsym(handle, "cuModuleLoadData"));
    driver.unload = reinterpret_cast<UnloadFn>(dlsym(handle, "cuModuleUnload"));
    dlclose(handle);  // RTLD_NOLOAD took a reference of its own; the library stays
    if (!driver.load || !driver.load_data || !driver.unload) {
      put(err, len, std::string(driver_lib) + " lacks cuModuleLoad, cuModuleLoadData or cuModuleUnload");
      return nullptr;
    }
    driver.name = driver_lib;
  } else if (driver.name != driver_lib) {
    put(err, len, "module loads are already routed to " + driver.name + ", not " + driver_lib);
    return nullptr;
  }
  for (const auto& s : lib.slots) {
    void* hook = s.symbol == "cuModuleLoad"       ? reinterpret_cast<void*>(&tra_hook_module_load)
                 : s.symbol == "cuModuleLoadData" ? reinterpret_cast<void*>(&tra_hook_module_load_data)
                                                  : nullptr;
    if (!hook) continue;
    if (!write_slot(lib, s.where, hook)) {
      put(err, len, "cannot write the import slot of " + s.symbol + " in " + lib.found);
      return nullptr;
    }
    ++*routed;
  }
  auto* t = new Tracker{lib.opened, {}};
  trackers.push_back(t);
  return t;
}

// How many modules the tracker holds.
size_t tra_modules_count(void* tracker) {
  std::lock_guard<std::mutex> lock(registry_lock);
  return static_cast<Tracker*>(tracker)->modules.size();
}

// Unloads the tracker's modules (call it once the library that loaded them is unloaded,
// with their CUDA context current) and frees it. Returns how many failed to unload.
int tra_modules_release(void* tracker) {
  auto* t = static_cast<Tracker*>(tracker);
  {
    std::lock_guard<std::mutex> lock(registry_lock);
    trackers.erase(std::remove(trackers.begin(), trackers.end(), t), trackers.end());
  }
  int failed = 0;
  for (void* m : t->modules) failed += driver.unload(m) != 0;
  delete t;
  return failed;
}

}  // extern "C"
