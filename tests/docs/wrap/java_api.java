// The Java API snippets of README.md and docs/bindings/java.md as a
// program: the buffers and indices they take from their caller (f16 bits).
import io.pqcache.*;
import java.nio.*;
import java.util.Random;

public class Snippet {
  static ByteBuffer randomF16(int n, Random random) {
    ByteBuffer b = ByteBuffer.allocateDirect(2 * n).order(ByteOrder.nativeOrder());
    for (int i = 0; i < n; i++) {
      b.putShort((short) ((random.nextInt(2) << 15) | 0x3000 | random.nextInt(0x800)));
    }
    return b.clear();
  }

  public static void main(String[] args) throws Exception {
    Random random = new Random(1);
    int layer = 0, promptTokens = 2048;
    ByteBuffer keys = randomF16(promptTokens * 3 * 64, random);
    ByteBuffer values = randomF16(promptTokens * 3 * 64, random);
    ByteBuffer newKey = randomF16(3 * 64, random), newValue = randomF16(3 * 64, random);
    ByteBuffer query = randomF16(9 * 64, random);
    // The snippets catch PqException and print it: anything on stderr fails.
    java.io.ByteArrayOutputStream errors = new java.io.ByteArrayOutputStream();
    java.io.PrintStream stderr = System.err;
    System.setErr(new java.io.PrintStream(errors, true));
@SNIPPET@
    System.setErr(stderr);
    if (errors.size() > 0) {
      System.out.println("FAIL: the snippet reported: " + errors);
      System.exit(1);
    }
    System.out.println("snippet ran without an error");
  }
}
