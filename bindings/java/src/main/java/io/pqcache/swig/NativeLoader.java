package io.pqcache.swig;

import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.Locale;

/**
 * Loads the JNI module libpqcache_jni.so once, before the first native call.
 *
 * <p>Order: the file named by the system property {@code pqcache.jni.library}
 * if set; else {@code System.loadLibrary("pqcache_jni")} (java.library.path,
 * where the packages install it); else the copy bundled in the jar under
 * {@code /native/<os>-<arch>/}, unpacked to a temporary file. In every case
 * libpqcache.so.0 itself is resolved by the dynamic loader (installed in a
 * system directory, the JNI module's RUNPATH, or LD_LIBRARY_PATH).
 */
public final class NativeLoader {
  /** The system property that names the JNI module file explicitly. */
  public static final String LIBRARY_PROPERTY = "pqcache.jni.library";

  private static final String NAME = "pqcache_jni";
  private static boolean loaded;

  private NativeLoader() {}

  /** Loads the module; later calls return at once. */
  public static synchronized void load() {
    if (loaded) {
      return;
    }
    String explicit = System.getProperty(LIBRARY_PROPERTY);
    if (explicit != null && !explicit.isEmpty()) {
      System.load(Path.of(explicit).toAbsolutePath().toString());
    } else {
      try {
        System.loadLibrary(NAME);
      } catch (UnsatisfiedLinkError notOnLibraryPath) {
        loadBundled(notOnLibraryPath);
      }
    }
    loaded = true;
  }

  /** The jar's resource folder for this platform, e.g. "linux-x86_64". */
  static String platform() {
    String os = System.getProperty("os.name", "").toLowerCase(Locale.ROOT).replace(" ", "");
    String arch = System.getProperty("os.arch", "").toLowerCase(Locale.ROOT);
    if (arch.equals("amd64") || arch.equals("x86-64")) {
      arch = "x86_64";
    } else if (arch.equals("arm64")) {
      arch = "aarch64";
    }
    return os + "-" + arch;
  }

  private static void loadBundled(UnsatisfiedLinkError notOnLibraryPath) {
    String resource = "/native/" + platform() + "/" + System.mapLibraryName(NAME);
    Path unpacked;
    try (InputStream in = NativeLoader.class.getResourceAsStream(resource)) {
      if (in == null) {
        throw linkError(NAME + " is not on java.library.path and the jar has no " + resource
            + " for this platform", notOnLibraryPath);
      }
      // A fresh file per process, so that no JVM overwrites a file another
      // one has mapped.
      unpacked = Files.createTempFile("libpqcache_jni", ".so");
      unpacked.toFile().deleteOnExit();
      Files.copy(in, unpacked, StandardCopyOption.REPLACE_EXISTING);
    } catch (IOException e) {
      throw linkError("cannot unpack " + resource + ": " + e, notOnLibraryPath);
    }
    try {
      System.load(unpacked.toAbsolutePath().toString());
    } catch (UnsatisfiedLinkError e) {
      // Usually libpqcache.so.0 itself is not where the dynamic loader looks.
      throw linkError("cannot load " + resource + " (libpqcache.so.0 must be installed, or on"
          + " LD_LIBRARY_PATH): " + e.getMessage(), notOnLibraryPath);
    }
  }

  private static UnsatisfiedLinkError linkError(String message, Throwable cause) {
    UnsatisfiedLinkError error = new UnsatisfiedLinkError(message);
    error.addSuppressed(cause);
    return error;
  }
}
